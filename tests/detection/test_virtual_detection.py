"""Detection times proven deterministically: the 18-fault run and the healthy run in virtual time, under promtool.

The scenario of tests/e2e/test_detection.py (16 nodes, 8 jobs, every fault class once, 280 s, scrape and
evaluation every 5 s, the e2e rules), run by :mod:`fleetscope_sim.detection_run`: the simulator ticks
without sleeping and every node is observed through the daemon's own collectors, NVML binding and push
parser in this process (:mod:`fleetscope_sim.virtual`). promtool evaluates the rules over what was
scraped; its answers are the same on every run and on any machine, loaded or not.

What is checked, twice over: promtool's own expression tests (each expected alert fires, with its labels,
between its fault's start and the fault's limit), and the first firing of every alert promtool reports,
matched to the faults as the live run matches them (fired, right labels, in time, nothing unexplained).
docs/detection-report.md is this run's report, and must be current.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fleetscope_sim.detection import Outcome
from fleetscope_sim.detection_run import FAULTS, DetectionResult, detection_run
from fleetscope_sim.faults import Fault

pytestmark = [
    pytest.mark.skipif(shutil.which("promtool") is None and not os.environ.get("CI"), reason="promtool not installed"),
    # One run of both clusters, most of it writing and reading the 16 nodes' kernel trees: the limit guards a
    # hang, not a time; on a machine shared by other work its wall time is several times its CPU time.
    pytest.mark.timeout(1800),
    pytest.mark.slow,
]
REPORT = Path(__file__).resolve().parents[2] / "docs" / "detection-report.md"


@pytest.fixture(scope="module")
def run() -> DetectionResult:
    return detection_run()


def _param(index: int, fault: Fault) -> object:
    name = f"{fault.kind}-{int(fault.param('xid'))}" if fault.kind == "xid" else fault.kind
    return pytest.param(index, id=name)


@pytest.mark.parametrize("index", [_param(i, f) for i, f in enumerate(FAULTS)])
def test_fault_raises_its_alert_with_the_right_labels_in_time(run: DetectionResult, index: int) -> None:
    outcome = run.outcomes[index]
    exp = outcome.expectation
    assert outcome.fired, f"{exp.fault.label()}: {[p.describe() for p in exp.expected]} never fired"
    assert outcome.labels_right, \
        f"{exp.fault.label()}: fired on other labels too: {[s.labels for s in outcome.wrong_labels]}"
    assert outcome.detect_seconds is not None and outcome.detect_seconds <= exp.within, \
        f"{exp.fault.label()}: detected after {outcome.detect_seconds:.0f}s (limit {exp.within:.0f}s)"


def test_promtool_finds_every_expected_alert_within_its_limit(run: DetectionResult) -> None:
    """The same claim as promtool's own expression tests, not through the parsing of its output."""
    assert run.fault_run.result.failed == {}, "\n\n".join(f"{k}\n{v}" for k, v in run.fault_run.result.failed.items())


def test_no_stray_alerts_in_the_fault_run(run: DetectionResult) -> None:
    assert [s.labels for s in run.strays] == []


def test_healthy_run_fires_nothing(run: DetectionResult) -> None:
    assert [s.labels for s in run.healthy] == []
    assert run.healthy_run.series > 100  # not vacuous: the healthy cluster was scraped


def test_the_detection_report_is_this_runs(run: DetectionResult) -> None:
    """docs/detection-report.md is generated: `fleetscope simulate --virtual --report docs/detection-report.md`.

    Compared whole, the times to detect included: the run is the same on every machine and every time. (Three
    step-path faults once came 5 s apart between runs: promtool evaluated the rule groups in Go's random map
    order, so an alert reading another group's record saw it one evaluation late or not; the run now gives
    promtool the files' group order.)"""
    assert REPORT.read_text(encoding="utf-8") == run.report(), \
        "docs/detection-report.md is stale: fleetscope simulate --virtual --report docs/detection-report.md"


def _outcome(run: DetectionResult, kind: str) -> Outcome:
    return next(o for o in run.outcomes if o.expectation.fault.kind == kind)


def test_a_hang_and_a_dead_rank_are_named_within_a_minute(run: DetectionResult) -> None:
    """tests/e2e/test_training_jobs.py's limits: TrainingJobHang and TrainingRankDead within 60 s of the fault,
    the hang naming the phase the rank is stuck in (data: its loader stopped answering)."""
    for kind in ("job_hang", "rank_dies"):
        seconds = _outcome(run, kind).detect_seconds
        assert seconds is not None and seconds <= 60, (kind, seconds)
    hang = _outcome(run, "job_hang").matched
    assert {s.labels.get("phase") for s in hang} == {"data"}, [s.labels for s in hang]


def test_a_throttled_gpu_s_straggler_is_named_with_its_cause(run: DetectionResult) -> None:
    """The straggler alert names the rank's node, GPU and cause: a throttled GPU (as the 10% straggler of
    tests/e2e/test_straggler_sensitivity.py; the rule's sensitivity is tests/alerts/test_sensitivity.py)."""
    for kind in ("thermal_throttle", "hw_slowdown"):
        fault = _outcome(run, kind).expectation.fault
        named = [s.labels for s in _outcome(run, kind).matched if s.labels["alertname"] == "TrainingStragglerRank"]
        assert named and all((n["instance"], n["gpu"], n.get("cause")) == (fault.node, str(fault.gpu), "gpu_throttled")
                             for n in named), named
