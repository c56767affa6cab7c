"""``fleetscope demo``: the simulated cluster, a local Prometheus with the shipped rules, and its story.

Everything runs from the installed package: the rules are rendered from the code this install
carries, so a wheel without a checkout fires the same alerts. Alertmanager and Grafana join when
they are installed. The terminal shows the timeline (:mod:`fleetscope_sim.timeline`) and, at the
end or on Ctrl-C, the detection summary; ``--check`` turns that summary into the exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import yaml

from fleetscope_sim.cluster import ClusterSpec, SimCluster
from fleetscope_sim.detection import AlertWatcher, expectation
from fleetscope_sim.grafana import COMPOSE_HINT, Grafana, GrafanaInstall, find_dashboards, find_grafana
from fleetscope_sim.prom import Alertmanager, Prometheus, alertmanager_available, prometheus_config
from fleetscope_sim.timeline import Timeline, fault_target

SCRAPE_INTERVAL = 5.0


def render_rules(directory: str, production: bool) -> str:
    """The shipped rules from this install's code (the same text as alerts/*.yml of its checkout)."""
    from fleetscope.rules.render import render
    from fleetscope.rules.settings import PRESETS

    preset = "production" if production else "e2e"
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"fleetscope.{preset}.rules.yml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render(PRESETS[preset], "rules", preset))
    return path


class Demo:
    def __init__(self, spec: ClusterSpec, args: argparse.Namespace, out: TextIO = sys.stdout) -> None:
        self.spec = spec
        self.args = args
        self.out = out
        self.expectations = [expectation(fault, spec) for fault in spec.faults]
        self.grafana_install: GrafanaInstall | None = None if args.no_grafana else find_grafana()
        self.use_alertmanager = alertmanager_available() and not args.no_alertmanager

    def ports(self) -> list[int]:
        ports = [node.port for node in self.spec.nodes] + [self.args.prometheus_port]
        if self.use_alertmanager:
            ports.append(self.args.alertmanager_port)
        if self.grafana_install is not None:
            ports.append(self.args.grafana_port)
        return ports

    def _print(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def run(self, workdir: str, stop: threading.Event) -> int:
        args = self.args
        cluster = SimCluster(self.spec, os.path.join(workdir, "nodes"))
        prometheus = Prometheus(os.path.join(workdir, "prometheus"), listen=f"127.0.0.1:{args.prometheus_port}")
        alertmanager = Alertmanager(os.path.join(workdir, "alertmanager"),
                                    listen=f"127.0.0.1:{args.alertmanager_port}") if self.use_alertmanager else None
        grafana: Grafana | None = None
        timeline: Timeline | None = None
        try:
            self._print(f"starting {len(self.spec.nodes)} simulated nodes and their daemons...")
            cluster.start()
            if alertmanager is not None:
                alertmanager.start()
            rules = args.rules or render_rules(os.path.join(workdir, "rules"), args.production_rules)
            prometheus.start(prometheus_config(self.spec, [rules], scrape_interval=SCRAPE_INTERVAL,
                                               alertmanager=alertmanager.address if alertmanager else None,
                                               addresses=cluster.addresses))
            grafana_note = self._start_grafana(workdir, prometheus)
            grafana = grafana_note[0]
            self._print(self._banner(cluster, prometheus, alertmanager, grafana, grafana_note[1], rules, workdir))
            thread = cluster.run_in_thread(args.duration)  # simulation time 0: everything is up
            timeline = Timeline(self.spec, self.expectations, AlertWatcher(prometheus.alerts), cluster.started_at,
                                out=self.out, causes=lambda labels: _causes(prometheus, labels))
            while thread.is_alive() and not stop.wait(1.0):
                timeline.update(cluster.elapsed)
                if args.check and args.duration is None and timeline.settled(cluster.elapsed):
                    break
        finally:
            if timeline is not None:
                timeline.close()
                timeline.update(cluster.elapsed)
                timeline.close()
                self._print("")
                self._print(timeline.summary(cluster.elapsed))
            cluster.stop()
            prometheus.stop()
            if alertmanager is not None:
                alertmanager.stop()
            if grafana is not None:
                grafana.stop()
        if args.check:
            return 0 if timeline is not None and timeline.all_detected() else 1
        return 0

    def _start_grafana(self, workdir: str, prometheus: Prometheus) -> tuple[Grafana | None, str]:
        """Grafana when it is installed and the dashboards are at hand; otherwise the line saying why."""
        if self.args.no_grafana:
            return None, "not started (--no-grafana)"
        install = self.grafana_install
        if install is None:
            return None, (f"not installed; `{COMPOSE_HINT}` in a clone of the repository runs this cluster "
                          "with Grafana on http://127.0.0.1:3000")
        dashboards = find_dashboards(self.args.dashboards)
        if dashboards is None:
            return None, "installed, but no dashboards/ directory found (run from a clone, or --dashboards DIR)"
        grafana = Grafana(install, Path(workdir) / "grafana", listen=f"127.0.0.1:{self.args.grafana_port}")
        try:
            grafana.start(dashboards, prometheus.url, SCRAPE_INTERVAL)
        except (OSError, RuntimeError, ValueError, TypeError, yaml.YAMLError) as exc:  # the demo goes on without it
            grafana.stop()
            return None, f"could not start: {exc}"
        return grafana, ""

    def _banner(self, cluster: SimCluster, prometheus: Prometheus, alertmanager: Alertmanager | None,
                grafana: Grafana | None, grafana_note: str, rules: str, workdir: str) -> str:
        lines = ["", "fleetscope demo is running.", ""]
        lines.append(f"  Prometheus    {prometheus.url}/alerts   (graph: {prometheus.url}/graph)")
        if alertmanager is not None:
            lines.append(f"  Alertmanager  {alertmanager.url}")
        if grafana is not None:
            lines.append(f"  Grafana       {grafana.url}   (anonymous viewer; admin/admin to edit)")
            lines += [f"    {board.title:<34} {grafana.dashboard_url(board)}" for board in grafana.dashboards]
        else:
            lines.append(f"  Grafana       {grafana_note}")
        lines.append(f"  rules         {rules}")
        lines.append("  nodes:")
        for node in self.spec.nodes:
            lines.append(f"    {node.name}  {node.profile.instance_type:<13} {cluster.url(node.name)}/metrics")
        lines.append("  jobs:")
        for job in self.spec.jobs:
            lines.append(f"    {job.name}  {job.world_size} ranks on {', '.join(job.nodes)}")
        lines.append("  fault schedule (each must raise its alert within its limit):")
        for exp in self.expectations:
            fault = exp.fault
            alerts = ", ".join(p.alertname for p in exp.expected)
            lines.append(f"    {f't+{fault.at:.0f}s':<7} {fault.kind:<21} {fault_target(fault, self.spec):<38} "
                         f"-> {alerts} within {exp.within:.0f} s")
        stop_how = "stops when every fault is decided" if self.args.check else "Ctrl-C stops everything"
        lines += ["", f"  files: {workdir} (removed on exit unless --workdir was given); {stop_how}.", ""]
        return "\n".join(lines)


def _causes(prometheus: Prometheus, labels: Mapping[str, str]) -> list[str]:
    """The straggler causes recorded for the alert's node (and GPU): the cause recording rule's series."""
    from fleetscope.promql import NODE_SLOWDOWN_CAUSES as CAUSES

    if not labels.get("instance"):
        return []
    try:
        series = prometheus.query(f'{CAUSES}{{instance="{labels["instance"]}"}}')
    except (OSError, ValueError, RuntimeError):
        return []
    gpu = labels.get("gpu")
    return sorted({s["metric"].get("cause", "") for s in series
                   if s["metric"].get("cause") and s["metric"].get("gpu") in (None, gpu)})
