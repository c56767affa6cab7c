"""Live: the simulator -> real node daemons -> a real Prometheus with the compressed rules.

The simulator and its senders run in a process of their own (``fleetscope simulate``), its node daemons
in theirs, each on a port the kernel chose; the test only reads Prometheus. Three faults that travel three
different paths each raise their alert, with the labels that name what broke: an Xid (kernel log and NVML),
a hung rank (the client's step reports) and EFA retransmits (sysfs counters). This run asserts plumbing and
verdicts, not times: every limit here is generous. How soon each of the 18 faults is detected, that
nothing else fires and that a healthy cluster stays silent are proven in virtual time with promtool.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetscope.dashboards import queries as dashboard_queries
from fleetscope_sim.cluster import make_cluster
from fleetscope_sim.detection import AlertWatcher, Outcome, evaluate, expectation
from fleetscope_sim.faults import parse_schedule
from fleetscope_sim.harness import Process, Prometheus, eventually
from fleetscope_sim.prom import prometheus_config
from tests.conftest import ROOT, require_binary

pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.timeout(600)]

RULES = os.path.join(ROOT, "alerts", "fleetscope.e2e.rules.yml")
# node-00 is a p5.48xlarge, node-01 a p4d.24xlarge; job-a spans both (ranks 0-7 on node-00, 8-15 on node-01).
SCHEDULE: list[dict[str, Any]] = [
    {"kind": "xid", "at": "20s", "node": "node-01", "gpu": 2, "params": {"xid": 79}},
    {"kind": "job_hang", "at": "25s", "job": "job-a", "rank": 9, "params": {"phase": "data"}},
    {"kind": "efa_retransmits", "at": "30s", "node": "node-00", "device": "rdmap96s0"},
]
FAULTS = tuple(parse_schedule({"faults": SCHEDULE}))
# Generous: the compressed rules decide within a minute or three; this run only asks that they do.
SLACK = 180.0


@dataclass
class LiveRun:
    outcomes: list[Outcome]
    rejected_panels: list[str]
    panels: int
    scraped: dict[str, bool]


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    require_binary("prometheus")
    workdir = tmp_path_factory.mktemp("detection")
    faults_file, ready_file = workdir / "faults.yaml", workdir / "simulator.ready"
    faults_file.write_text(yaml.safe_dump({"faults": SCHEDULE}))
    spec = make_cluster(nodes=2, jobs=1, faults=FAULTS)
    expectations = [expectation(fault, spec) for fault in FAULTS]
    simulator = Process([sys.executable, "-m", "fleetscope", "simulate", "--nodes", "2", "--jobs", "1",
                         "--base-port", "0", "--faults", str(faults_file), "--ready-file", str(ready_file),
                         "--workdir", str(workdir / "nodes")], workdir / "simulator.log",
                        env={k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")})
    prometheus = Prometheus(workdir / "prometheus")
    simulator.spawn()
    try:
        ready = eventually(lambda: _read_ready(simulator, ready_file), 180, "the simulator's nodes to answer")
        prometheus.start(prometheus_config(spec, [RULES], scrape_interval=5.0, addresses=ready["nodes"]))
        watcher = AlertWatcher(prometheus.alerts)

        def decided() -> list[Outcome] | None:
            simulator.check_running()
            watcher.poll()
            outcomes, _ = evaluate(expectations, list(watcher.sightings.values()), ready["started_at"])
            return outcomes if all(o.fired for o in outcomes) else None

        limit = max(e.fault.at + e.within for e in expectations) + SLACK
        try:
            outcomes = eventually(decided, limit, "every fault's alert to fire", interval=2.0)
        except TimeoutError:
            outcomes = evaluate(expectations, list(watcher.sightings.values()), ready["started_at"])[0]
        rejected, panels = [], dashboard_queries()
        for query in panels:
            try:
                prometheus.query(query.expr)
            except Exception as exc:  # a query Prometheus refuses is a broken panel
                rejected.append(f"{query.dashboard} / {query.panel} ({query.ref_id}): {exc}\n{query.expr}")
        # Every node scraped, at some point of the run: the last scrape of a node may time out on a loaded machine.
        scraped = {r["metric"]["instance"]: r["value"][1] == "1"
                   for r in prometheus.query('max_over_time(up{job="fleetscope"}[1h])')}
        yield LiveRun(outcomes, rejected, len(panels), scraped)
    finally:
        prometheus.stop()
        simulator.stop()


def _read_ready(simulator: Process, path: Path) -> dict[str, Any] | None:
    simulator.check_running()
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None


@pytest.mark.parametrize("index", range(len(FAULTS)), ids=[f.kind for f in FAULTS])
def test_fault_raises_its_alert_with_the_right_labels(live_run: LiveRun, index: int) -> None:
    outcome = live_run.outcomes[index]
    exp = outcome.expectation
    assert outcome.fired, f"{exp.fault.label()}: {[p.describe() for p in exp.expected]} never fired"
    assert outcome.labels_right, \
        f"{exp.fault.label()}: fired on other labels too: {[s.labels for s in outcome.wrong_labels]}"


def test_every_node_is_scraped_and_every_dashboard_query_is_accepted(live_run: LiveRun) -> None:
    assert live_run.scraped == {"node-00": True, "node-01": True}
    assert live_run.panels > 100
    assert not live_run.rejected_panels, "\n\n".join(live_run.rejected_panels)
