"""``fleetscope simulate``, ``fleetscope demo`` and the internal ``fleetscope simulate-node``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import sys
import threading
from typing import Any

from fleetscope.config import LogConfig
from fleetscope.logs import setup_logging
from fleetscope_sim.faults import Fault, ScheduleError, load_schedule, parse_schedule
from fleetscope_sim.schedules import SCHEDULES
from fleetscope_sim.tree import make_workdir


def _cluster_args(parser: argparse.ArgumentParser, default_faults: str | None, interval: float) -> None:
    parser.add_argument("--nodes", type=int, default=8, help="Simulated nodes (default 8).")
    parser.add_argument("--jobs", type=int, default=2, help="Training jobs the nodes are split into (default 2).")
    parser.add_argument("--profiles", default="p5.48xlarge,p4d.24xlarge",
                        help="Instance profiles, assigned to nodes in turn (default: p5.48xlarge,p4d.24xlarge).")
    parser.add_argument("--base-port", type=int, default=9500,
                        help="node-00 listens here, node-01 one above... (0: each binds a port the kernel chooses)")
    parser.add_argument("--faults", metavar="FILE|NAME", default=default_faults,
                        help=f"Fault schedule: a YAML file, or a built-in one ({', '.join(SCHEDULES)}); "
                             f"default: {default_faults or 'none'}.")
    parser.add_argument("--duration", type=float, default=None, help="Stop after this many seconds (default: run).")
    parser.add_argument("--step-seconds", type=float, default=2.0, help="Typical training step time.")
    parser.add_argument("--interval", type=float, default=interval,
                        help=f"The node daemons' collection interval (default {interval:g}).")
    parser.add_argument("--workdir", default=None, help="Where node trees and logs go (default: a temp dir).")
    parser.add_argument("--seed", type=int, default=1)


def _faults(args: argparse.Namespace) -> list[Fault]:
    try:
        if args.faults in SCHEDULES:
            return parse_schedule(SCHEDULES[args.faults])
        if args.faults:
            return load_schedule(args.faults)
        return []
    except (OSError, ScheduleError) as exc:
        raise SystemExit(f"fleetscope: fault schedule: {exc}") from None


def _make(args: argparse.Namespace, faults: list[Fault]) -> Any:
    from fleetscope_sim.cluster import make_cluster

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
    if args.virtual:
        from fleetscope_sim.detection_run import write_report

        setup_logging(LogConfig(level="warning"))
        return write_report(args.report)
    setup_logging(LogConfig(level="info"))
    from fleetscope_sim.cluster import SimCluster

    spec = _make(args, [])
    spec = dataclasses.replace(spec, faults=tuple(_scheduled(args, spec)))
    workdir = args.workdir or make_workdir("fleetscope-sim-")
    cluster = SimCluster(spec, workdir)
    stop = threading.Event()
    _stop_on_signals(stop)
    cluster.start()
    try:
        for node in spec.nodes:
            print(f"{node.name} ({node.profile.instance_type}): {cluster.url(node.name)}/metrics")
        print(f"trees and logs: {workdir}", flush=True)
        cluster.start_clock()
        thread = cluster.run_in_thread(args.duration)
        if args.ready_file:
            _write_whole(args.ready_file, {"started_at": cluster.started_at, "nodes": cluster.addresses})
        while thread.is_alive() and not stop.wait(0.5):
            pass
    finally:
        cluster.stop()
        _remove_scratch(args, workdir)
    return 0


def _write_whole(path: str, data: Any) -> None:
    """``data`` as JSON to ``path``, renamed into place: a reader never sees half of it."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump(data, out)
    os.replace(partial, path)


def _remove_scratch(args: argparse.Namespace, workdir: str) -> None:
    """Delete a work directory this command made itself (it lives on tmpfs: memory)."""
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


def _scheduled(args: argparse.Namespace, spec: Any) -> list[Fault]:
    """The schedule's faults; of a built-in one, those this cluster has targets for (a smaller demo drops
    the rest). A file's schedule must fit whole: a fault it names on a missing node is refused."""
    faults = _faults(args)
    if args.faults not in SCHEDULES:
        try:
            dataclasses.replace(spec, faults=tuple(faults)).validate()
        except ValueError as exc:
            raise SystemExit(f"fleetscope: {exc}") from None
        return faults
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
    for port in filter(None, ports):  # 0: the kernel chooses one when the server binds
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


def cmd_demo(args: argparse.Namespace) -> int:
    setup_logging(LogConfig(level="warning"))
    from fleetscope_sim.demo import Demo
    from fleetscope_sim.prom import find_binary

    if find_binary("prometheus") is None:
        print("fleetscope demo needs the Prometheus server on PATH (Debian: apt-get install prometheus).\n"
              "`fleetscope simulate` runs the simulated nodes without it.", file=sys.stderr)
        return 2
    spec = _make(args, [])
    spec = dataclasses.replace(spec, faults=tuple(_scheduled(args, spec)))
    demo = Demo(spec, args)
    busy = _ports_in_use(demo.ports())
    if busy:
        print(f"fleetscope demo: ports already in use: {', '.join(map(str, busy))} "
              "(choose others with --base-port / --prometheus-port / --alertmanager-port / --grafana-port)",
              file=sys.stderr)
        return 2
    workdir = args.workdir or make_workdir("fleetscope-demo-")
    stop = threading.Event()
    _stop_on_signals(stop)
    try:
        return demo.run(workdir, stop)
    finally:
        _remove_scratch(args, workdir)


def cmd_simulate_node(args: argparse.Namespace) -> int:
    setup_logging(LogConfig(level="warning"))
    settings = dict(item.partition("=")[::2] for item in args.set)
    if args.source:
        from fleetscope.capture.archive import CaptureError
        from fleetscope_sim.replay import serve_capture

        try:
            serve_capture(args.source, args.listen, settings)
        except CaptureError as exc:
            print(f"fleetscope simulate-node: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.root:
        print("fleetscope simulate-node: give --root (a simulated node) or --from (a capture)", file=sys.stderr)
        return 2
    from fleetscope_sim.nodeproc import serve_node
    from fleetscope_sim.tree import NodePaths

    serve_node(NodePaths(args.root), args.listen, args.interval, settings)
    return 0


def register_simulate(sub: Any) -> None:
    parser = sub.add_parser("simulate", help="Run a simulated GPU cluster through the real daemon (no Prometheus).")
    _cluster_args(parser, None, 2.5)
    parser.add_argument("--ready-file", default=None, metavar="PATH",
                        help="Once every node answers and the clock runs, write the nodes' addresses and the Unix "
                             "time of simulation time 0 here (JSON), for whoever started the simulator.")
    parser.add_argument("--virtual", action="store_true",
                        help="Run the detection scenario (16 nodes, 18 faults, and a healthy cluster) in virtual "
                             "time, through the daemon's collectors in process, and evaluate the e2e rules with "
                             "promtool; exit 1 unless every fault is detected in time and nothing else fires. "
                             "The cluster options above do not apply.")
    parser.add_argument("--report", metavar="FILE", default="-",
                        help="With --virtual: where the detection report goes (default: stdout), e.g. "
                             "docs/detection-report.md.")
    parser.set_defaults(func=cmd_simulate)


def register_demo(sub: Any) -> None:
    parser = sub.add_parser(
        "demo", help="Simulated cluster + local Prometheus (and Alertmanager, Grafana) with the shipped rules.",
        description="A simulated GPU cluster watched by a local Prometheus with the shipped rules: prints each "
                    "fault as it is injected and each alert as it fires or resolves, then a detection summary.")
    # Collecting as often as Prometheus scrapes (5 s): more often is work nobody reads, and on a busy
    # 2-core machine it made the daemons miss their scrape timeout.
    _cluster_args(parser, "demo", 5.0)
    parser.add_argument("--check", action="store_true",
                        help="Stop once every scheduled fault has raised its alert or passed its limit; exit 1 "
                             "unless every one was detected with the right labels in time.")
    parser.add_argument("--rules", default=None,
                        help="Rule file to load (default: the shipped rules, time-compressed, from this install).")
    parser.add_argument("--production-rules", action="store_true",
                        help="Load the production rules (real windows: alerts take 10-30 minutes).")
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--alertmanager-port", type=int, default=9093)
    parser.add_argument("--no-alertmanager", action="store_true")
    parser.add_argument("--grafana-port", type=int, default=3000)
    parser.add_argument("--no-grafana", action="store_true", help="Do not start Grafana even if it is installed.")
    parser.add_argument("--dashboards", metavar="DIR", default=None,
                        help="The dashboards/ directory for Grafana (default: the checkout's, or ./dashboards).")
    parser.set_defaults(func=cmd_demo)


def register_node(sub: Any) -> None:
    parser = sub.add_parser("simulate-node", help="Serve one simulated node's tree, or a capture of a real node "
                            "(fleetscope capture), with the real daemon.")
    parser.add_argument("--root", default=None, help="The node's directory written by the simulator.")
    parser.add_argument("--from", dest="source", metavar="CAPTURE", default=None,
                        help="Replay a capture (.tar.gz from fleetscope capture, or its unpacked directory); "
                             "its daemon settings apply, --set overrides them (--interval does not apply).")
    parser.add_argument("--listen", required=True, help="host:port for /metrics and the push API.")
    parser.add_argument("--interval", type=float, default=2.5, help="Collection interval of every collector.")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="Any daemon setting, e.g. --set push.median-window=128 (repeatable).")
    parser.set_defaults(func=cmd_simulate_node)
