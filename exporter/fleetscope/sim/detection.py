"""Did the rules catch the faults? Expectations, an alert watcher, and the detection report.

An :class:`Expectation` says which alert a fault should raise and with which
labels (node, GPU, device, job, rank), how fast, and which other alerts are
its honest consequences (a throttled GPU also runs hot; a hung rank also
stops pushing). Every other firing alert is a stray.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetscope.sim.faults import Fault

LabelSet = Mapping[str, str]


@dataclass(frozen=True)
class AlertPattern:
    """An alert name plus the labels it must carry (a subset match; a tuple value means "one of")."""

    alertname: str
    labels: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)

    def matches(self, alert: LabelSet) -> bool:
        if alert.get("alertname") != self.alertname:
            return False
        for key, want in self.labels.items():
            have = alert.get(key)
            if isinstance(want, tuple):
                if have not in want:
                    return False
            elif have != want:
                return False
        return True

    def describe(self) -> str:
        inner = ", ".join(f"{k}={'|'.join(v) if isinstance(v, tuple) else v}" for k, v in sorted(self.labels.items()))
        return f"{self.alertname}{{{inner}}}"


@dataclass(frozen=True)
class Expectation:
    fault: Fault
    expected: tuple[AlertPattern, ...]  # every one must fire
    within: float  # seconds after the fault starts
    tolerated: tuple[AlertPattern, ...] = ()  # consequences that may also fire
    note: str = ""


@dataclass
class Sighting:
    labels: dict[str, str]
    first_firing: float  # Unix time the watcher first saw it firing


class AlertWatcher:
    """Polls Prometheus's active alerts and remembers when each alert (name + labels) first fired."""

    def __init__(self, fetch: Callable[[], list[dict[str, Any]]], interval: float = 2.0) -> None:
        self._fetch = fetch
        self.interval = interval
        self.sightings: dict[tuple[tuple[str, str], ...], Sighting] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        try:
            alerts = self._fetch()
        except Exception:  # Prometheus busy or restarting: try again next round
            self.errors += 1
            return
        now = time.time()
        for alert in alerts:
            if alert.get("state") != "firing":
                continue
            labels = {str(k): str(v) for k, v in alert.get("labels", {}).items()}
            key = tuple(sorted(labels.items()))
            if key not in self.sightings:
                self.sightings[key] = Sighting(labels, now)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="alert-watcher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.poll()


@dataclass
class Outcome:
    expectation: Expectation
    fired: bool
    labels_right: bool
    detect_seconds: float | None  # from fault start to the last expected alert firing
    matched: list[Sighting]
    wrong_labels: list[Sighting]  # the expected alert name, but on other labels

    @property
    def passed(self) -> bool:
        return self.fired and self.labels_right and self.detect_seconds is not None \
            and self.detect_seconds <= self.expectation.within


def evaluate(
    expectations: Sequence[Expectation], sightings: Sequence[Sighting], started_at: float,
) -> tuple[list[Outcome], list[Sighting]]:
    """Match sightings to expectations; returns the outcomes and the stray alerts."""
    outcomes: list[Outcome] = []
    explained: set[int] = set()
    for exp in expectations:
        fault_start = started_at + exp.fault.at
        matched: list[Sighting] = []
        first_times: list[float] = []
        for pattern in exp.expected:
            hits = [s for s in sightings if pattern.matches(s.labels) and s.first_firing >= fault_start - 1]
            matched += hits
            if hits:
                first_times.append(min(s.first_firing for s in hits))
        fired = len(first_times) == len(exp.expected)
        names = {p.alertname for p in exp.expected}
        wrong = [s for s in sightings if s.labels.get("alertname") in names and s not in matched
                 and _near(s, exp.fault)]
        for s in matched:
            explained.add(id(s))
        for s in sightings:
            if any(p.matches(s.labels) for p in exp.tolerated) and s.first_firing >= fault_start - 1:
                explained.add(id(s))
        outcomes.append(Outcome(
            exp, fired, fired and not wrong, max(first_times) - fault_start if fired else None, matched, wrong,
        ))
    strays = [s for s in sightings if id(s) not in explained]
    return outcomes, strays


def _near(sighting: Sighting, fault: Fault) -> bool:
    """The sighting is on the fault's node or job (a wrong-label hit rather than an unrelated stray)."""
    labels = sighting.labels
    return (fault.node is not None and labels.get("instance") == fault.node) or \
        (fault.job is not None and labels.get("training_job") == fault.job)


def _labels_text(labels: Mapping[str, str]) -> str:
    keep = ("instance", "gpu", "device", "training_job", "rank", "allowance", "severity")
    return ", ".join(f"{k}={labels[k]}" for k in keep if k in labels)


def render_report(
    outcomes: Sequence[Outcome],
    strays: Sequence[Sighting],
    healthy_sightings: Sequence[Sighting],
    meta: Mapping[str, str],
) -> str:
    """The detection report (Markdown), generated from one end-to-end run."""
    passed = sum(o.passed for o in outcomes)
    lines = [
        "# Detection report",
        "",
        "Generated by `tests/e2e/test_detection.py` from one run of the simulated cluster against a real",
        "Prometheus server evaluating the time-compressed rules. Do not edit by hand: run",
        "`python3 -m pytest tests/e2e -m e2e` to regenerate it.",
        "",
    ]
    for key, value in meta.items():
        lines.append(f"- **{key}**: {value}")
    lines += [
        "",
        f"**{passed} of {len(outcomes)} faults detected as intended; "
        f"{len(strays)} stray alert(s) in the fault run; {len(healthy_sightings)} alert(s) in the healthy run.**",
        "",
        "| Fault | Target | Starts | Expected alert | Fired | Labels right | Time to detect | Limit | Result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        f = o.expectation.fault
        target = ", ".join(x for x in (
            f.node, f.job, f"gpu {f.gpu}" if f.gpu is not None else "", f.device or "",
            f"rank {f.rank}" if f.rank is not None else "",
            f"xid {int(f.param('xid'))}" if f.kind == "xid" else "") if x)
        expected = "<br>".join(p.describe() for p in o.expectation.expected)
        detect = f"{o.detect_seconds:.0f} s" if o.detect_seconds is not None else "–"
        lines.append(
            f"| {f.kind} | {target} | t+{f.at:.0f} s | {expected} | {'yes' if o.fired else 'no'} | "
            f"{'yes' if o.labels_right else 'no'} | {detect} | {o.expectation.within:.0f} s | "
            f"{'pass' if o.passed else 'FAIL'} |"
        )
    lines += ["", "## Consequences allowed to fire alongside", ""]
    for o in outcomes:
        if o.expectation.tolerated:
            lines.append(f"- {o.expectation.fault.kind}: " + ", ".join(p.describe() for p in o.expectation.tolerated))
    lines += ["", "## Stray alerts (fault run)", ""]
    lines += [f"- {s.labels.get('alertname')} ({_labels_text(s.labels)})" for s in strays] or ["None."]
    lines += ["", "## Alerts in the healthy run", ""]
    lines += [f"- {s.labels.get('alertname')} ({_labels_text(s.labels)})" for s in healthy_sightings] or ["None."]
    wrong = [(o, s) for o in outcomes for s in o.wrong_labels]
    if wrong:
        lines += ["", "## Expected alerts seen with wrong labels", ""]
        lines += [f"- {o.expectation.fault.kind}: {s.labels.get('alertname')} ({_labels_text(s.labels)})"
                  for o, s in wrong]
    notes = [o for o in outcomes if o.expectation.note]
    if notes:
        lines += ["", "## Notes", ""]
        lines += [f"- {o.expectation.fault.kind}: {o.expectation.note}" for o in notes]
    return "\n".join(lines) + "\n"
