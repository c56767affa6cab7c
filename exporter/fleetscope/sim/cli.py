"""``fleetscope simulate``, ``fleetscope demo`` and the internal ``fleetscope simulate-node``."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import signal
import socket
import sys
import threading
from typing import Any

from fleetscope.sim.faults import Fault, ScheduleError, load_schedule, parse_schedule
from fleetscope.sim.tree import make_workdir


def _cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=8, help="Simulated nodes (default 8).")
    parser.add_argument("--jobs", type=int, default=2, help="Training jobs the nodes are split into (default 2).")
    parser.add_argument("--profiles", default="p5.48xlarge,p4d.24xlarge",
                        help="Instance profiles, assigned to nodes in turn (default: p5.48xlarge,p4d.24xlarge).")
    parser.add_argument("--base-port", type=int, default=9500, help="node-00 listens here, node-01 one above...")
    parser.add_argument("--faults", metavar="FILE", default=None, help="Fault schedule (YAML).")
    parser.add_argument("--duration", type=float, default=None, help="Stop after this many seconds (default: run).")
    parser.add_argument("--step-seconds", type=float, default=2.0, help="Typical training step time.")
    parser.add_argument("--interval", type=float, default=2.5, help="The node daemons' collection interval.")
    parser.add_argument("--workdir", default=None, help="Where node trees and logs go (default: a temp dir).")
    parser.add_argument("--seed", type=int, default=1)


def _faults(args: argparse.Namespace, default: dict[str, Any] | None) -> list[Fault]:
    try:
        if args.faults:
            return load_schedule(args.faults)
        return parse_schedule(default)
    except (OSError, ScheduleError) as exc:
        raise SystemExit(f"fleetscope: fault schedule: {exc}") from None


def _make(args: argparse.Namespace, faults: list[Fault]) -> Any:
    from fleetscope.sim.cluster import make_cluster

    try:
        return make_cluster(
            nodes=args.nodes, jobs=args.jobs, base_port=args.base_port, profiles=args.profiles.split(","),
            faults=faults, step_seconds=args.step_seconds, collector_interval=args.interval, seed=args.seed,
        )
    except ValueError as exc:
        raise SystemExit(f"fleetscope: {exc}") from None


def _stop_on_signals(stop: threading.Event) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())


def cmd_simulate(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per push drowns the simulator's own news
    from fleetscope.sim.cluster import SimCluster

    spec = _make(args, _faults(args, None))
    workdir = args.workdir or make_workdir("fleetscope-sim-")
    cluster = SimCluster(spec, workdir)
    stop = threading.Event()
    _stop_on_signals(stop)
    cluster.start()
    try:
        for node in spec.nodes:
            print(f"{node.name} ({node.profile.instance_type}): {cluster.url(node.name)}/metrics")
        print(f"trees and logs: {workdir}", flush=True)
        thread = cluster.run_in_thread(args.duration)
        while thread.is_alive() and not stop.wait(0.5):
            pass
    finally:
        cluster.stop()
        _remove_scratch(args, workdir)
    return 0


def _remove_scratch(args: argparse.Namespace, workdir: str) -> None:
    """Delete a work directory this command made itself (it lives on tmpfs: memory)."""
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


def default_rules(compressed: bool) -> str | None:
    """The shipped rule file from a source checkout (the demo's use case: a fresh clone)."""
    here = os.path.dirname(os.path.abspath(__file__))
    alerts = os.path.normpath(os.path.join(here, "..", "..", "..", "alerts"))
    name = "fleetscope.e2e.rules.yml" if compressed else "fleetscope.rules.yml"
    path = os.path.join(alerts, name)
    return path if os.path.exists(path) else None


def _fitting(spec: Any, faults: list[Fault]) -> list[Fault]:
    """The built-in schedule's faults that this cluster has targets for (a smaller demo drops the rest)."""
    kept = []
    for fault in faults:
        try:
            dataclasses.replace(spec, faults=(fault,)).validate()
        except ValueError:
            continue
        kept.append(fault)
    return kept


def _ports_in_use(ports: list[int]) -> list[int]:
    busy = []
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


def cmd_demo(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from fleetscope.sim.cluster import SimCluster
    from fleetscope.sim.prom import (
        Alertmanager,
        Prometheus,
        alertmanager_available,
        find_binary,
        prometheus_config,
    )
    from fleetscope.sim.schedules import DEMO_SCHEDULE

    if find_binary("prometheus") is None:
        print("fleetscope demo needs the Prometheus server on PATH (Debian: apt-get install prometheus).\n"
              "`fleetscope simulate` runs the simulated nodes without it.", file=sys.stderr)
        return 2
    spec = _make(args, _faults(args, None))
    if not args.faults:
        spec = dataclasses.replace(spec, faults=tuple(_fitting(spec, parse_schedule(DEMO_SCHEDULE))))
    busy = _ports_in_use([n.port for n in spec.nodes] + [args.prometheus_port])
    if busy:
        print(f"fleetscope demo: ports already in use: {', '.join(map(str, busy))} "
              "(choose others with --base-port / --prometheus-port)", file=sys.stderr)
        return 2
    rules = args.rules or default_rules(compressed=not args.production_rules)
    workdir = args.workdir or make_workdir("fleetscope-demo-")
    cluster = SimCluster(spec, os.path.join(workdir, "nodes"))
    prometheus = Prometheus(os.path.join(workdir, "prometheus"), listen=f"127.0.0.1:{args.prometheus_port}")
    alertmanager = None
    if alertmanager_available() and not args.no_alertmanager:
        alertmanager = Alertmanager(os.path.join(workdir, "alertmanager"), listen=f"127.0.0.1:{args.alertmanager_port}")
    stop = threading.Event()
    _stop_on_signals(stop)
    try:
        print("starting the simulated cluster...", flush=True)
        cluster.start()
        if alertmanager is not None:
            alertmanager.start()
        prometheus.start(prometheus_config(
            spec, [rules] if rules else [], scrape_interval=5.0,
            alertmanager=alertmanager.listen if alertmanager else None,
        ))
        print(_banner(spec, cluster, prometheus, alertmanager, rules, workdir), flush=True)
        thread = cluster.run_in_thread(args.duration)
        while thread.is_alive() and not stop.wait(0.5):
            pass
    finally:
        cluster.stop()
        prometheus.stop()
        if alertmanager is not None:
            alertmanager.stop()
        _remove_scratch(args, workdir)
    return 0


def _banner(spec: Any, cluster: Any, prometheus: Any, alertmanager: Any, rules: str | None, workdir: str) -> str:
    lines = ["", "fleetscope demo is running.", ""]
    lines.append(f"  Prometheus    {prometheus.url}/alerts   (graph: {prometheus.url}/graph)")
    if alertmanager is not None:
        lines.append(f"  Alertmanager  {alertmanager.url}")
    lines.append(f"  rules         {rules or 'none found (pass --rules FILE)'}")
    lines.append("  nodes:")
    for node in spec.nodes:
        lines.append(f"    {node.name}  {node.profile.instance_type:<13} {cluster.url(node.name)}/metrics")
    lines.append("  jobs:")
    for job in spec.jobs:
        lines.append(f"    {job.name}  {job.world_size} ranks on {', '.join(job.nodes)}")
    lines.append("  faults:")
    for fault in spec.faults:
        lines.append(f"    t+{fault.at:>4.0f}s  {fault.label()}")
    lines += ["", f"  files: {workdir} (node trees and logs; removed on exit unless --workdir was given)",
              "  Ctrl-C stops everything.", ""]
    return "\n".join(lines)


def cmd_simulate_node(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    from fleetscope.sim.nodeproc import serve_node
    from fleetscope.sim.tree import NodePaths

    settings = dict(item.partition("=")[::2] for item in args.set)
    serve_node(NodePaths(args.root), args.listen, args.interval, settings)
    return 0


def register_simulate(sub: Any) -> None:
    parser = sub.add_parser("simulate", help="Run a simulated GPU cluster through the real daemon (no Prometheus).")
    _cluster_args(parser)
    parser.set_defaults(func=cmd_simulate)


def register_demo(sub: Any) -> None:
    parser = sub.add_parser("demo", help="Simulated cluster + local Prometheus (and Alertmanager) with the shipped rules.")
    _cluster_args(parser)
    parser.add_argument("--rules", default=None, help="Rule file to load (default: alerts/fleetscope.e2e.rules.yml).")
    parser.add_argument("--production-rules", action="store_true",
                        help="Load the production rules (real windows: alerts take 10-30 minutes).")
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--alertmanager-port", type=int, default=9093)
    parser.add_argument("--no-alertmanager", action="store_true")
    parser.set_defaults(func=cmd_demo)


def register_node(sub: Any) -> None:
    parser = sub.add_parser("simulate-node", help="(internal) Serve one simulated node's tree with the real daemon.")
    parser.add_argument("--root", required=True, help="The node's directory written by the simulator.")
    parser.add_argument("--listen", required=True, help="host:port for /metrics and the push API.")
    parser.add_argument("--interval", type=float, default=2.5, help="Collection interval of every collector.")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="Any daemon setting, e.g. --set push.median-window=128 (repeatable).")
    parser.set_defaults(func=cmd_simulate_node)
