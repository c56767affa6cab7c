"""The demo's story on the terminal: each fault as it is injected, each alert as it fires or resolves.

Alert lines carry the alert's labels (job, rank, node, GPU, device), a straggler's likely cause and,
when the alert is what a fault should raise, the time from the fault to the alert. On a terminal a
status line at the bottom shows the schedule's progress; in a log a progress line appears every
minute instead. :meth:`Timeline.summary` is the table printed at the end (or on Ctrl-C).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import TextIO

from fleetscope_sim.cluster import ClusterSpec
from fleetscope_sim.detection import AlertEvent, AlertWatcher, Expectation, Outcome, evaluate
from fleetscope_sim.faults import KINDS, Fault

# The cause recording rule's ``cause`` values (signals.NODE_SLOWDOWN_CAUSES) in words.
CAUSE_TEXT: dict[str, str] = {
    "gpu_throttled": "GPU clock throttling (thermal or power slowdown)",
    "gpu_low_sm_clock": "GPU SM clock below its peers",
    "efa_retransmits": "EFA retransmits",
    "efa_errors": "EFA errors",
    "data_wait": "waiting on the input pipeline",
}

CauseLookup = Callable[[Mapping[str, str]], list[str]]


def where(labels: Mapping[str, str]) -> str:
    """An alert's place in words: ``job-a rank 11 on node-01 gpu 3``, ``node-05 rdmap16s27``."""
    parts: list[str] = []
    if labels.get("training_job"):
        parts.append(labels["training_job"] + (f" rank {labels['rank']}" if labels.get("rank") else ""))
    if labels.get("instance"):
        parts.append(("on " if parts else "") + labels["instance"])
    if labels.get("gpu"):
        parts.append(f"gpu {labels['gpu']}")
    if labels.get("device"):
        parts.append(labels["device"])
    if labels.get("xid"):
        parts.append(f"xid {labels['xid']}")
    if labels.get("allowance"):
        parts.append(f"{labels['allowance']} allowance")
    if labels.get("reason"):
        parts.append(f"({labels['reason']})")
    return " ".join(parts)


def fault_target(fault: Fault, cluster: ClusterSpec) -> str:
    """Where a fault strikes, with the rank or GPU on the other side: ``node-01 gpu 3 (job-a rank 11)``."""
    if fault.job is not None:
        job = cluster.job(fault.job)
        if fault.rank is None:
            return fault.job
        node, gpu = job.placement(fault.rank)
        return f"{fault.job} rank {fault.rank} ({node} gpu {gpu})"
    node = fault.node or ""
    text = node
    if fault.gpu is not None:
        text += f" gpu {fault.gpu}"
        on_node = cluster.job_on(node)
        rank = None if on_node is None else on_node.rank_at(node, fault.gpu)
        if on_node is not None and rank is not None:
            text += f" ({on_node.name} rank {rank})"
    if fault.device:
        text += f" {fault.device}"
    if fault.kind == "xid":
        text += f" xid {int(fault.param('xid'))}"
    return text


def describe(fault: Fault) -> str:
    """What the fault does, in a sentence."""
    if fault.kind == "xid":
        from fleetscope.sources.xid import XID_CATALOG

        xid = int(fault.param("xid"))
        mnemonic, action = XID_CATALOG.get(xid, ("", "UNKNOWN"))
        return f"the driver logs Xid {xid}{f' ({mnemonic})' if mnemonic else ''}, catalog action {action}."
    if fault.kind == "job_hang":
        return (f"the rank stalls inside its {fault.choice('phase')} phase; the others finish their part of the "
                "step and wait for it in the collective, so no rank completes another step.")
    return KINDS[fault.kind].help


def _seconds(value: float) -> str:
    return f"{value:.0f} s"


@dataclass
class Row:
    fault: str
    target: str
    injected: str
    expected: str
    detected: str
    limit: str
    result: str


class Timeline:
    def __init__(
        self,
        cluster: ClusterSpec,
        expectations: Sequence[Expectation],
        watcher: AlertWatcher,
        started_at: float,
        out: TextIO = sys.stdout,
        live: bool | None = None,
        causes: CauseLookup | None = None,
        progress_every: float = 60.0,
    ) -> None:
        self.cluster = cluster
        self.expectations = list(expectations)
        self.watcher = watcher
        self.started_at = started_at
        self.out = out
        self.live = out.isatty() if live is None else live
        self.causes = causes
        self.progress_every = progress_every
        self._injected: set[int] = set()
        self._ended: set[int] = set()
        self._fired_at: dict[tuple[tuple[str, str], ...], float] = {}
        self._status = ""
        self._last_progress = 0.0
        self.horizon = max((e.fault.at + e.within for e in self.expectations), default=0.0)

    # -- the live part -------------------------------------------------------------------------

    def update(self, elapsed: float) -> None:
        """Print what happened up to simulation time ``elapsed`` (call about once a second)."""
        for index, exp in enumerate(self.expectations):
            fault = exp.fault
            if index not in self._injected and elapsed >= fault.at:
                self._injected.add(index)
                self._line(fault.at, "FAULT", f"[{len(self._injected)}/{len(self.expectations)}] {fault.kind}  "
                           f"{fault_target(fault, self.cluster)}: {describe(fault)}")
            end = fault.at + fault.duration
            if index not in self._ended and elapsed >= end:
                self._ended.add(index)
                self._line(end, "ENDED", f"{fault.kind}  {fault_target(fault, self.cluster)}")
        for event in self.watcher.poll():
            self._alert_line(event)
        if self.live:
            self._draw_status(elapsed)
        elif elapsed - self._last_progress >= self.progress_every:
            self._last_progress = elapsed
            self._line(elapsed, "PROGRESS", self._progress_text(elapsed))

    def _alert_line(self, event: AlertEvent) -> None:
        labels = event.labels
        key = tuple(sorted(labels.items()))
        t = event.at - self.started_at
        name = labels.get("alertname", "?") + (" (critical)" if labels.get("severity") == "critical" else "")
        text = f"{name}  {where(labels)}"
        if event.kind == "resolved":
            fired = self._fired_at.pop(key, None)
            if fired is not None:
                text += f" (fired for {_seconds(event.at - fired)})"
            self._line(t, "RESOLVED", text)
            return
        self._fired_at[key] = event.at
        if name.startswith("TrainingStraggler"):
            causes = [labels["cause"]] if labels.get("cause") else (self.causes(labels) if self.causes else [])
            if causes:
                text += " — cause: " + ", ".join(CAUSE_TEXT.get(c, c.replace("_", " ")) for c in causes)
        sighting = self.watcher.sightings.get(key)
        earlier = [] if sighting is None else [s - self.started_at for s in sighting.firings[:-1]]
        text += " — " + self._explain(labels, t, earlier)
        self._line(t, "FIRING", text)

    def _explain(self, labels: Mapping[str, str], t: float, earlier: Sequence[float] = ()) -> str:
        """Which injected fault this alert answers (and how fast), or that none explains it.

        ``earlier``: when the same alert started firing before (simulation times)."""
        consequence = None
        for exp in self.expectations:
            if exp.fault.at > t + 1:
                continue
            if any(p.matches(labels) for p in exp.expected):
                if any(e >= exp.fault.at - 1 for e in earlier):
                    return f"fires again, {_seconds(t - exp.fault.at)} after {exp.fault.kind}"
                return f"detected {_seconds(t - exp.fault.at)} after {exp.fault.kind}"
            if consequence is None and any(p.matches(labels) for p in exp.tolerated):
                consequence = f"consequence of {exp.fault.kind}"
        return consequence or "no scheduled fault explains it"

    def _progress_text(self, elapsed: float) -> str:
        outcomes = self.outcomes()
        injected = sum(1 for e in self.expectations if e.fault.at <= elapsed)
        detected = sum(1 for o in outcomes if o.passed)
        text = f"{injected}/{len(self.expectations)} faults injected, {detected} detected"
        upcoming = [e.fault for e in self.expectations if e.fault.at > elapsed]
        if upcoming:
            nxt = min(upcoming, key=lambda f: f.at)
            text += f"; next: {nxt.kind} at t+{nxt.at:.0f}s"
        return text

    def _draw_status(self, elapsed: float) -> None:
        width = 24
        share = min(1.0, elapsed / self.horizon) if self.horizon > 0 else 1.0
        done = round(width * share)
        self._status = f"  t+{elapsed:.0f}s [{'#' * done}{'.' * (width - done)}] {self._progress_text(elapsed)}"
        self.out.write("\r\033[K" + self._status)
        self.out.flush()

    def _line(self, t: float, kind: str, text: str) -> None:
        if self.live and self._status:
            self.out.write("\r\033[K")
        self.out.write(f"{f't+{t:.0f}s':<7} {kind:<9} {text}\n")
        if self.live and self._status:
            self.out.write(self._status)
        self.out.flush()

    def close(self) -> None:
        """Clear the status line (before the summary)."""
        if self.live and self._status:
            self.out.write("\r\033[K")
            self.out.flush()
            self._status = ""

    # -- the verdict ---------------------------------------------------------------------------

    def outcomes(self) -> list[Outcome]:
        return evaluate(self.expectations, list(self.watcher.sightings.values()), self.started_at)[0]

    def status(self, outcome: Outcome, elapsed: float) -> str:
        exp = outcome.expectation
        if elapsed < exp.fault.at:
            return "not injected"
        if outcome.passed:
            return "detected"
        if outcome.fired and not outcome.labels_right:
            return "wrong labels"
        if outcome.fired:
            return "late"
        if elapsed < exp.fault.at + exp.within:
            return "waiting"
        return "missed"

    def settled(self, elapsed: float) -> bool:
        """Every fault is injected and decided: detected, or past its limit."""
        return all(self.status(o, elapsed) in ("detected", "wrong labels", "late", "missed")
                   for o in self.outcomes())

    def all_detected(self) -> bool:
        return all(o.passed for o in self.outcomes())

    def summary(self, elapsed: float) -> str:
        outcomes = self.outcomes()
        rows: list[Row] = []
        for outcome in outcomes:
            exp = outcome.expectation
            fault = exp.fault
            result = self.status(outcome, elapsed)
            for i, pattern in enumerate(exp.expected):
                seconds = outcome.pattern_seconds[i] if i < len(outcome.pattern_seconds) else None
                first = i == 0
                rows.append(Row(
                    fault.kind if first else "", fault_target(fault, self.cluster) if first else "",
                    f"t+{fault.at:.0f}s" if first else "",
                    f"{pattern.alertname} {where({k: v for k, v in pattern.labels.items() if isinstance(v, str)})}",
                    "-" if seconds is None else _seconds(seconds), _seconds(exp.within) if first else "",
                    result if first else "",
                ))
        header = Row("fault", "target", "injected", "expected alert", "detected after", "limit", "result")
        table = [astuple(row) for row in (header, *rows)]
        widths = [max(len(cells[i]) for cells in table) for i in range(len(table[0]))]
        detected = sum(o.passed for o in outcomes)
        lines = [f"Detection summary at t+{elapsed:.0f}s: {detected} of {len(outcomes)} faults detected "
                 "with the right labels"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip() for cells in table]
        others = self._other_alerts(outcomes)
        lines.append("  other alerts: " + (", ".join(others) if others else "none"))
        return "\n".join(lines) + "\n"

    def _other_alerts(self, outcomes: Sequence[Outcome]) -> list[str]:
        """Consequences (one each) and alerts no fault explains (grouped by name)."""
        sightings = list(self.watcher.sightings.values())
        strays = evaluate(self.expectations, sightings, self.started_at)[1]
        matched = {id(s) for o in outcomes for s in o.matched}
        out = []
        unexplained: dict[str, list[str]] = {}
        for sighting in sightings:
            if sighting in strays:
                unexplained.setdefault(sighting.labels.get("alertname", "?"), []).append(where(sighting.labels))
            elif id(sighting) not in matched:
                t = sighting.first_firing - self.started_at
                out.append(f"{sighting.labels.get('alertname')} {where(sighting.labels)} "
                           f"({self._explain(sighting.labels, t)})")
        for name, places in unexplained.items():
            shown = "; ".join(places[:3]) + (f"; and {len(places) - 3} more" if len(places) > 3 else "")
            out.append(f"{name} x{len(places)} ({shown}: no scheduled fault explains it)")
        return out
