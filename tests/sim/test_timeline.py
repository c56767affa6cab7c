"""The demo's terminal story, driven by a scripted Prometheus alert list."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from typing import Any

from fleetscope_sim.cluster import make_cluster
from fleetscope_sim.detection import AlertWatcher, expectation
from fleetscope_sim.faults import parse_schedule
from fleetscope_sim.schedules import DEMO_SCHEDULE
from fleetscope_sim.timeline import Timeline, fault_target, where

ROOT = Path(__file__).resolve().parents[2]
SPEC = make_cluster(nodes=8, jobs=2, faults=parse_schedule(DEMO_SCHEDULE))
THROTTLED = {"alertname": "GpuThrottled", "instance": "node-01", "gpu": "3", "uuid": "GPU-x", "severity": "warning"}
STRAGGLER = {"alertname": "TrainingStragglerRank", "training_job": "job-a", "rank": "11", "instance": "node-01",
             "gpu": "3", "pp_stage": "0", "severity": "warning"}
LATE = {"alertname": "NcclLateRank", "training_job": "job-a", "rank": "11", "instance": "node-01",
        "severity": "critical"}
STRAY = {"alertname": "TcpRetransmitRatioHigh", "instance": "node-07", "severity": "warning"}


class ScriptedAlerts:
    def __init__(self) -> None:
        self.firing: list[dict[str, str]] = []

    def __call__(self) -> list[dict[str, Any]]:
        return [{"state": "firing", "labels": labels} for labels in self.firing]


def _timeline(elapsed_now: float, live: bool = False) -> tuple[Timeline, ScriptedAlerts, io.StringIO]:
    alerts = ScriptedAlerts()
    out = io.StringIO()
    expectations = [expectation(f, SPEC) for f in SPEC.faults]
    timeline = Timeline(SPEC, expectations, AlertWatcher(alerts), started_at=time.time() - elapsed_now, out=out,
                        live=live, causes=lambda labels: ["gpu_throttled"] if labels.get("gpu") == "3" else [])
    return timeline, alerts, out


def test_labels_and_targets_read_as_places() -> None:
    assert where(STRAGGLER) == "job-a rank 11 on node-01 gpu 3"
    assert where({"instance": "node-05", "device": "rdmap16s27"}) == "node-05 rdmap16s27"
    assert where({"instance": "node-06", "gpu": "5", "xid": "48"}) == "node-06 gpu 5 xid 48"
    targets = [fault_target(f, SPEC) for f in SPEC.faults]
    assert targets == ["node-01 gpu 3 (job-a rank 11)", "node-05 rdmap16s27", "node-06 gpu 5 (job-b rank 21) xid 48",
                       "node-02", "job-b rank 20 (node-06 gpu 4)"]


def test_faults_then_alerts_with_labels_cause_and_time_to_detect() -> None:
    timeline, alerts, out = _timeline(100.0)
    alerts.firing = [THROTTLED]
    timeline.update(100.0)
    alerts.firing = [THROTTLED, STRAGGLER, STRAY]
    timeline.update(101.0)
    alerts.firing = [STRAGGLER, STRAY]
    timeline.update(102.0)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("t+60s   FAULT     [1/5] thermal_throttle  node-01 gpu 3 (job-a rank 11): GPU heats up")
    assert re.fullmatch(r"t\+(99|100|101)s +FIRING +GpuThrottled  node-01 gpu 3 — detected (39|40|41) s after "
                        r"thermal_throttle", lines[1]), lines[1]
    straggler = next(line for line in lines if "TrainingStragglerRank" in line)
    assert "TrainingStragglerRank  job-a rank 11 on node-01 gpu 3 — cause: GPU clock throttling" in straggler
    assert "after thermal_throttle" in straggler
    stray = next(line for line in lines if "TcpRetransmitRatioHigh" in line)
    assert stray.endswith("TcpRetransmitRatioHigh  node-07 — no scheduled fault explains it")
    resolved = next(line for line in lines if "RESOLVED" in line)
    assert re.search(r"RESOLVED  GpuThrottled  node-01 gpu 3 \(fired for [0-9] s\)", resolved)
    # A minute since the last progress report (none yet): one line of progress in a log.
    assert any("PROGRESS  1/5 faults injected, 0 detected; next: efa_retransmits at t+120s" in line
               for line in lines)


def test_summary_lists_every_fault_with_its_state() -> None:
    timeline, alerts, _ = _timeline(200.0)
    alerts.firing = [THROTTLED, STRAGGLER]
    timeline.update(200.0)
    assert timeline.summary(200.0).startswith("Detection summary at t+200s: 0 of 5")  # the Inspector's alert too
    alerts.firing = [THROTTLED, STRAGGLER, LATE]
    timeline.update(200.0)
    summary = timeline.summary(200.0)
    assert summary.startswith("Detection summary at t+200s: 1 of 5 faults detected with the right labels")
    rows = summary.splitlines()
    throttle = next(r for r in rows if "thermal_throttle" in r)
    assert "GpuThrottled node-01 gpu 3" in throttle and "180 s" in throttle and throttle.rstrip().endswith("detected")
    assert any("TrainingStragglerRank job-a rank 11" in r for r in rows)
    assert next(r for r in rows if "efa_retransmits" in r).rstrip().endswith("waiting")
    assert next(r for r in rows if "job_hang" in r).rstrip().endswith("not injected")
    assert not timeline.settled(200.0) and not timeline.all_detected()
    # Far past every limit with nothing more: the rest are missed, and the run is decided.
    assert timeline.settled(10_000.0)
    assert next(r for r in timeline.summary(10_000.0).splitlines() if "job_hang" in r).rstrip().endswith("missed")


def test_live_status_line_is_redrawn_under_the_events() -> None:
    timeline, _, out = _timeline(61.0, live=True)
    timeline.update(61.0)
    text = out.getvalue()
    assert "FAULT" in text and "\r\x1b[K  t+61s [" in text and "1/5 faults injected" in text
    timeline.close()
    assert out.getvalue().endswith("\r\x1b[K")


def _transcript_lines(path: str) -> list[str]:
    text = (ROOT / path).read_text()
    blocks = re.findall(r"```text\n(.*?)```", text, re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("t+")]


def test_the_docs_show_what_the_terminal_shows() -> None:
    """docs/demo.md and the README quote a real run: their lines must be the ones the timeline prints."""
    expectations = [expectation(f, SPEC) for f in SPEC.faults]
    for path in ("docs/demo.md", "README.md"):
        lines = _transcript_lines(path)
        assert any("FIRING" in line for line in lines), path
        for line in lines:
            match = re.fullmatch(r"t\+(\d+)s +(FAULT|FIRING|RESOLVED|PROGRESS|ENDED) +(.*)", line)
            assert match, f"{path}: {line}"
            kind, text = match.group(2), match.group(3)
            if kind == "FAULT":
                # Exactly what the timeline prints for the demo schedule's fault at that time.
                out = io.StringIO()
                timeline = Timeline(SPEC, expectations, AlertWatcher(list), started_at=0.0, out=out, live=False,
                                    progress_every=1e9)
                timeline.update(float(match.group(1)))
                assert line in out.getvalue().splitlines(), f"{path}: {line}"
            elif kind == "FIRING":
                name, _, rest = text.partition("  ")
                alert = name.removesuffix(" (critical)")
                place = rest.split(" — ")[0]
                explained = rest.split(" — ")[-1]
                patterns = [p for e in expectations for p in (*e.expected, *e.tolerated) if p.alertname == alert]
                assert patterns, f"{path}: {alert} is not what any demo fault raises"
                assert any(place.startswith(where({k: v for k, v in p.labels.items() if isinstance(v, str)}))
                           for p in patterns), f"{path}: {line}"
                assert re.fullmatch(r"(detected|fires again,) \d+ s after \w+|consequence of \w+", explained), line
