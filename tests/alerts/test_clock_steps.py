"""A node's wall clock stepped under healthy jobs raises nothing on the production rules (#30 item 4).

The series are what the real steps collector exports, scraped every 15 s on Prometheus's clock, while
the node's wall clock is set back 600 s (or forward 2 h) and its ranks keep stepping and reporting as
fleetscope.client does (a step a second, stamped on the node's clock; a report with the rank's position
every second). promtool then evaluates the production rule file over them: no TrainingJobHang and no
TrainingRankSilent at any evaluation, and the node's clock offset is seen. Before the fix the last-step
time froze (set back) or every rank expired (set forward), and TrainingJobHang fired on the healthy job.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetscope.collectors.steps import StepsCollector
from fleetscope.config import load
from fleetscope.push.models import RankReport
from fleetscope_sim.virtual import promtool_test_rules
from tests.clocks import FakeClock

from .rulefiles import ALERTS_DIR

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"), reason="promtool not installed (apt-get install prometheus)"
)
START = 1_800_000_000.0  # Prometheus's clock at the first scrape; promtool's time 0
SCRAPE = 15
MINUTES = 30
STEP_AT = 10 * 60  # when node b's wall clock is set
# Job "solo" runs on node b alone; job "pair" has a rank on each node.
RANKS = {("solo", 0): "b", ("solo", 1): "b", ("pair", 0): "a", ("pair", 1): "b"}


def scrape(collector: StepsCollector) -> dict[str, float]:
    out = {}
    for family in collector.collect():
        for sample in family.samples:
            if sample.name.startswith(("fleetscope_training_", "fleetscope_push_scrape")):
                inner = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{inner}}}"] = sample.value
    return out


def record(step_by: float) -> dict[str, list[float | None]]:
    """Every series of both nodes on the 15 s grid; Unix times as Prometheus's clock would compare them."""
    clocks = {node: FakeClock(START) for node in ("a", "b")}
    nodes = {node: StepsCollector(load(flags={}, environ={}), clock=clocks[node]) for node in ("a", "b")}
    series: dict[str, list[float | None]] = {}
    samples = MINUTES * 60 // SCRAPE + 1
    for second in range(MINUTES * 60 + 1):
        if second == STEP_AT:
            clocks["b"].step(step_by)
        for (job, rank), node in RANKS.items():
            wall = clocks[node].wall
            phase = "comm" if second % 2 else "compute"
            nodes[node].store.ingest([RankReport(
                job, rank, {"pid": 100 + rank, "start_time": 1, "session": 1},
                [{"step": second + 1, "step_seconds": 1.0, "timestamp": wall - 0.2}],
                {"step": second + 2, "phase": phase, "since": wall - 0.1},
            )])
        if second % SCRAPE == 0:
            for node, collector in nodes.items():
                for name, value in scrape(collector).items():
                    unix = name.split("{")[0].endswith("_timestamp_seconds")
                    target = f'{{instance="{node}",job="fleetscope"' + ("" if "{}" in name else ",")
                    series.setdefault(name.replace("{", target, 1), [None] * samples)[second // SCRAPE] = (
                        value - START if unix else value)
        for clock in clocks.values():
            clock.now += 1
    return series


def values(points: list[float | None]) -> str:
    return " ".join("_" if v is None else f"{v:.3f}" for v in points)


@pytest.mark.parametrize(("step_by", "offset"), [(-600.0, 600), (7200.0, -7200)], ids=["back-600s", "forward-2h"])
def test_a_stepped_node_clock_raises_no_hang_and_no_silence(tmp_path: Path, step_by: float, offset: int) -> None:
    result = replay(tmp_path, step_by, offset, ALERTS_DIR / "fleetscope.rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def replay(tmp_path: Path, step_by: float, offset: int, rules: Path) -> subprocess.CompletedProcess[str]:
    """promtool over the recorded series with ``rules`` (the rules before the fix fail it: a hang and a silent
    rank when set back, progress 2 h in the future when set forward)."""
    series = record(step_by)
    end = f"{MINUTES * 60}s"
    fired = 'max_over_time(ALERTS{alertname=~"TrainingJobHang|TrainingRankSilent"}[31m])'
    test: dict[str, Any] = {
        "rule_files": [str(rules)],
        "evaluation_interval": f"{SCRAPE}s",
        "tests": [{
            "interval": f"{SCRAPE}s",
            "input_series": [{"series": name, "values": values(points)} for name, points in sorted(series.items())],
            "promql_expr_test": [
                {"expr": fired, "eval_time": end, "exp_samples": []},
                # Not vacuous: the rules saw node b's clock move, and node a's not.
                {"expr": "round(instance:fleetscope_push_scrape_timestamp_seconds:offset)", "eval_time": end,
                 "exp_samples": [{"labels": '{instance="a", job="fleetscope"}', "value": 0},
                                 {"labels": '{instance="b", job="fleetscope"}', "value": offset}]},
                # Both jobs stepped to the end, on Prometheus's clock.
                {"expr": "round(time() - training_job:fleetscope_training_progress:timestamp_seconds)",
                 "eval_time": end,
                 "exp_samples": [{"labels": '{training_job="pair"}', "value": 0},
                                 {"labels": '{training_job="solo"}', "value": 0}]},
            ],
        }],
    }
    path = tmp_path / "clock.test.yml"
    path.write_text(yaml.safe_dump(test, width=1_000_000), encoding="utf-8")
    return promtool_test_rules(path)
