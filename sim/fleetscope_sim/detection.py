"""Did the rules catch the faults? Expectations, an alert watcher, and the detection report.

An :class:`Expectation` says which alert a fault should raise and with which
labels (node, GPU, device, job, rank), how fast, and which other alerts are
its honest consequences (a throttled GPU also runs hot; a hung rank also
stops pushing). Every other firing alert is a stray.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetscope_sim.cluster import ClusterSpec
from fleetscope_sim.faults import Fault

LabelSet = Mapping[str, str]
AlertKey = tuple[tuple[str, str], ...]

# How long a fault may take to raise its alert on the time-compressed rules (1 m rate windows,
# for: of 10 s to 1 m, scrape and evaluation every 5 s): the slowest path is a straggler, whose
# per-rank median needs its window to fill before the ratio crosses and the for: begins.
DETECT_LIMIT = 180.0
XID_DETECT_LIMIT = 60.0  # an Xid is an event: it reaches the kernel log and NVML at once


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
    firings: list[float] = field(default_factory=list)  # every time it started firing (again), first_firing first

    def __post_init__(self) -> None:
        if not self.firings:
            self.firings.append(self.first_firing)

    def first_since(self, start: float) -> float | None:
        """When it started firing at or after ``start`` (one second of slack for clocks and polls)."""
        return min((t for t in self.firings if t >= start - 1), default=None)


@dataclass(frozen=True)
class AlertEvent:
    kind: Literal["firing", "resolved"]
    labels: dict[str, str]
    at: float  # Unix time the watcher saw the change


class AlertWatcher:
    """Polls Prometheus's active alerts and remembers when each alert (name + labels) first fired."""

    def __init__(self, fetch: Callable[[], list[dict[str, Any]]], interval: float = 2.0) -> None:
        self._fetch = fetch
        self.interval = interval
        self.sightings: dict[AlertKey, Sighting] = {}
        self.firing: dict[AlertKey, dict[str, str]] = {}  # firing at the last successful poll
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> list[AlertEvent]:
        """Record what fires now; returns the alerts that started firing or resolved since the last poll."""
        try:
            alerts = self._fetch()
        except Exception:  # Prometheus busy or restarting: try again next round
            self.errors += 1
            return []
        now = time.time()
        firing: dict[AlertKey, dict[str, str]] = {}
        for alert in alerts:
            if alert.get("state") != "firing":
                continue
            labels = {str(k): str(v) for k, v in alert.get("labels", {}).items()}
            firing[tuple(sorted(labels.items()))] = labels
        events = [AlertEvent("firing", labels, now) for key, labels in firing.items() if key not in self.firing]
        events += [AlertEvent("resolved", labels, now) for key, labels in self.firing.items() if key not in firing]
        for key, labels in firing.items():
            if key not in self.sightings:
                self.sightings[key] = Sighting(labels, now)
            elif key not in self.firing:
                self.sightings[key].firings.append(now)  # resolved in between: a new episode
        self.firing = firing
        return events

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


def expectation(fault: Fault, cluster: ClusterSpec, note: str = "") -> Expectation:
    """What ``fault`` must raise in ``cluster`` with the shipped rules, and what may honestly come with it."""
    node, job_name = fault.node or "", fault.job or ""
    on_gpu: dict[str, str | tuple[str, ...]] = {"instance": node, "gpu": str(fault.gpu)}
    on_device: dict[str, str | tuple[str, ...]] = {"instance": node, "device": fault.device or ""}
    # EFA counters are summed per node at the daemon's default detail level: the alerts name the node
    on_efa: dict[str, str | tuple[str, ...]] = {"instance": node}
    kind = fault.kind
    if kind in ("thermal_throttle", "hw_slowdown"):
        gpu_alerts = (AlertPattern("GpuTemperatureNearSlowdown", on_gpu), AlertPattern("GpuSmClockBelowPeers", on_gpu))
        job = cluster.job_on(node)
        rank = None if job is None or fault.gpu is None else job.rank_at(node, fault.gpu)
        if job is None or rank is None:  # an idle GPU slows nobody
            return Expectation(fault, (AlertPattern("GpuThrottled", on_gpu),), DETECT_LIMIT, gpu_alerts, note)
        straggler: dict[str, str | tuple[str, ...]] = {"training_job": job.name, "rank": str(rank)}
        return Expectation(
            fault,
            (AlertPattern("GpuThrottled", on_gpu), AlertPattern("TrainingStragglerRank", straggler),
             AlertPattern("NcclLateRank", straggler)),
            DETECT_LIMIT, (*gpu_alerts, AlertPattern("TrainingJobSlowdown", {"training_job": job.name}),
                           AlertPattern("TrainingNodeRepeatedlySlow", {"instance": node})), note,
        )
    if kind == "xid":
        xid = int(fault.param("xid"))
        lost = (AlertPattern("GpuLost", on_gpu), AlertPattern("GpuMissing", {"instance": node}))
        return Expectation(fault, (AlertPattern(xid_alert(xid), {**on_gpu, "xid": str(xid)}),), XID_DETECT_LIMIT,
                           lost if xid == 79 else (), note)
    on_job: dict[str, str | tuple[str, ...]] = {"training_job": job_name}
    on_rank: dict[str, str | tuple[str, ...]] = {**on_job, "rank": str(fault.rank)}
    if kind == "rank_slow":  # a straggler: its step timings and the NCCL Inspector both name it
        named = (AlertPattern("TrainingStragglerRank", on_rank), AlertPattern("NcclLateRank", on_rank))
        rank_node = cluster.job(job_name).placement(int(fault.rank or 0))[0]
        # A straggler flagged in more than one window (compressed windows flap) marks its node a repeat offender.
        consequences = (AlertPattern("TrainingJobSlowdown", on_job),
                        AlertPattern("TrainingNodeRepeatedlySlow", {"instance": rank_node}))
        return Expectation(fault, named, DETECT_LIMIT, consequences, note)
    simple: dict[str, tuple[str, Mapping[str, str | tuple[str, ...]], tuple[AlertPattern, ...]]] = {
        # The driver logs Xid 48 with the DBE: its reset advice is the same GPU's.
        "ecc_uncorrectable": ("GpuUncorrectableEccError", on_gpu,
                              (AlertPattern(xid_alert(48), {**on_gpu, "xid": "48"}),)),
        "row_remap_pending": ("GpuRowRemapPending", on_gpu, ()),
        "efa_retransmits": ("EfaRetransmitTimeouts", on_efa, ()),
        "efa_impaired": ("EfaImpairedRemoteConnections", on_efa, (AlertPattern("EfaUnresponsiveRemote", on_efa),)),
        "efa_rx_drops": ("EfaRxDrops", on_efa, ()),
        "efa_device_missing": ("EfaDevicesMissing", {"instance": node}, ()),
        "ena_pps_exceeded": ("EnaAllowanceExceeded", {**on_device, "allowance": "pps"}, ()),
        "ena_bw_exceeded": ("EnaAllowanceExceeded", {**on_device, "allowance": ("bw_in", "bw_out")}, ()),
        "tcp_retransmit_storm": ("TcpRetransmitRatioHigh", {"instance": node}, ()),
        # A rank waiting for its input arrives last at every collective too: the Inspector names it as well.
        "slow_dataloader": ("TrainingRankInputBound", on_rank,
                            (AlertPattern("TrainingJobSlowdown", on_job), AlertPattern("NcclLateRank", on_rank))),
        # The hang alert names the rank that is not waiting in the collective; its idle GPU may show too.
        "job_hang": ("TrainingJobHang", on_rank, (AlertPattern("TrainingLowGpuActivity", on_job),)),
        # Its process is gone without a goodbye; its GPU goes idle while the peers wait for it.
        "rank_dies": ("TrainingRankDead", on_rank, (AlertPattern("TrainingLowGpuActivity", on_job),)),
    }
    name, labels, tolerated = simple[kind]
    return Expectation(fault, (AlertPattern(name, labels),), DETECT_LIMIT, tolerated, note)


def xid_alert(xid: int) -> str:
    """The alert the shipped rules raise for an Xid: by its catalog action class."""
    from fleetscope.rules.gpu import XID_CLASSES
    from fleetscope.sources.xid import xid_action

    action = xid_action(xid)
    for name, _severity, actions, _advice in XID_CLASSES:
        if re.fullmatch(f"(?i)({actions})", action):
            return name
    return "GpuXidNeedsInspection"


@dataclass
class Outcome:
    expectation: Expectation
    fired: bool
    labels_right: bool
    detect_seconds: float | None  # from fault start to the last expected alert firing
    matched: list[Sighting]
    wrong_labels: list[Sighting]  # the expected alert name, but on other labels
    pattern_seconds: tuple[float | None, ...] = ()  # per expected pattern: fault start to its first firing

    @property
    def passed(self) -> bool:
        return self.fired and self.labels_right and self.detect_seconds is not None \
            and self.detect_seconds <= self.expectation.within


def evaluate(
    expectations: Sequence[Expectation], sightings: Sequence[Sighting], started_at: float,
) -> tuple[list[Outcome], list[Sighting]]:
    """Match sightings to expectations; returns the outcomes and the stray alerts."""
    outcomes: list[Outcome] = []
    explained: set[tuple[int, float]] = set()  # (sighting, episode start) some fault accounts for
    for exp in expectations:
        fault_start = started_at + exp.fault.at
        matched: list[Sighting] = []
        first_times: list[float] = []
        per_pattern: list[float | None] = []
        for pattern in exp.expected:
            hits = [s for s in sightings if pattern.matches(s.labels) and s.first_since(fault_start) is not None]
            matched += hits
            first = min((t for s in hits if (t := s.first_since(fault_start)) is not None), default=None)
            per_pattern.append(None if first is None else first - fault_start)
            if first is not None:
                first_times.append(first)
        fired = len(first_times) == len(exp.expected)
        names = {p.alertname for p in exp.expected}
        wrong = [s for s in sightings if s.labels.get("alertname") in names and s not in matched
                 and _near(s, exp.fault)]
        for s in sightings:
            if any(p.matches(s.labels) for p in exp.expected + exp.tolerated):
                for t in s.firings:
                    if t >= fault_start - 1:
                        explained.add((id(s), t))
        outcomes.append(Outcome(
            exp, fired, fired and not wrong, max(first_times) - fault_start if fired else None, matched, wrong,
            tuple(per_pattern),
        ))
    # A stray: an alert with an episode that began before any fault could explain it.
    strays = [s for s in sightings if any((id(s), t) not in explained for t in s.firings)]
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
    generated_by: tuple[str, str] = (
        "`tests/e2e/test_detection.py` from one run of the simulated cluster against a real Prometheus server "
        "evaluating the time-compressed rules", "`python3 -m pytest tests/e2e -m e2e`"),
) -> str:
    """The detection report (Markdown), generated from one run: ``generated_by`` is (what made it, the command
    that makes it again)."""
    passed = sum(o.passed for o in outcomes)
    lines = [
        "# Detection report",
        "",
        f"Generated by {generated_by[0]}. Do not edit by hand: run {generated_by[1]} to regenerate it.",
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
