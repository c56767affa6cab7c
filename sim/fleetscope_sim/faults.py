"""The fault schedule: which fault hits which node, GPU, device or rank, and when.

A schedule is YAML (or the same structure built in Python)::

    faults:
      - kind: thermal_throttle
        at: 60s            # seconds after the simulation starts
        duration: 5m       # optional; absent means "until the end"
        node: node-03
        gpu: 2
        params: {slowdown: 1.3}
      - kind: job_hang
        at: 90s
        job: job-b
        rank: 5
        params: {phase: data}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetscope.config import parse_seconds

Target = Literal["gpu", "efa", "ena", "node", "rank", "job"]


@dataclass(frozen=True)
class FaultKind:
    name: str
    target: Target
    help: str
    defaults: Mapping[str, float] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # word params; the first is the default


KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind("thermal_throttle", "gpu",
                  "GPU heats up, thermal slowdown cuts its clocks; its rank's compute slows.",
                  {"slowdown": 1.35, "clock_ratio": 0.6, "temperature": 89.0}),
        FaultKind("hw_slowdown", "gpu", "HW slowdown (power brake) halves the GPU clocks; its rank's compute slows.",
                  {"slowdown": 1.6, "clock_ratio": 0.5}),
        FaultKind("xid", "gpu", "The driver logs an Xid (params.xid: 79, 48, 94, 119, ...) for the GPU.",
                  {"count": 1}, required=("xid",)),
        FaultKind("ecc_uncorrectable", "gpu", "Uncorrectable (double-bit) ECC errors on the GPU's memory.",
                  {"count": 2}),
        FaultKind("row_remap_pending", "gpu", "A row remap is pending: the GPU needs a reset to remap it.", {}),
        FaultKind("efa_retransmits", "efa", "SRD retransmits and retransmit timeouts on an EFA device.",
                  {"packets_per_second": 3000.0, "timeouts_per_second": 2.0}),
        FaultKind("efa_impaired", "efa", "SRD connections enter the impaired state on an EFA device.",
                  {"events_per_second": 1.0}),
        FaultKind("efa_rx_drops", "efa", "An EFA device drops received packets.", {"drops_per_second": 800.0}),
        FaultKind("efa_device_missing", "efa", "An EFA device disappears from sysfs.", {}),
        FaultKind("ena_pps_exceeded", "ena", "The ENA interface exceeds its PPS allowance.",
                  {"packets_per_second": 1500.0}),
        FaultKind("ena_bw_exceeded", "ena", "The ENA interface exceeds its bandwidth allowance (in and out).",
                  {"packets_per_second": 1500.0}),
        FaultKind("tcp_retransmit_storm", "node", "TCP retransmits a large share of its segments.",
                  {"ratio": 0.08}),
        FaultKind("slow_dataloader", "rank", "One rank waits on its input pipeline for a large share of each step.",
                  {"data_share": 0.4}),
        FaultKind("rank_slow", "rank", "One rank's compute is slower (a straggler without a visible hardware cause).",
                  {"slowdown": 1.3}),
        FaultKind("job_hang", "rank",
                  "One rank stalls inside a step (params.phase: data or compute); the others do their part of "
                  "that step and wait for it in the collective, so no rank completes another step.",
                  choices={"phase": ("data", "compute")}),
        FaultKind("rank_dies", "rank",
                  "One rank's process dies; the others wait for it in the collective of that step, for good."),
    )
}


class ScheduleError(ValueError):
    """The schedule names an unknown kind, target or parameter."""


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float
    duration: float = math.inf
    node: str | None = None
    gpu: int | None = None
    device: str | None = None
    job: str | None = None
    rank: int | None = None
    params: Mapping[str, float | str] = field(default_factory=dict)

    @property
    def spec(self) -> FaultKind:
        return KINDS[self.kind]

    def param(self, name: str) -> float:
        return float(self.params.get(name, self.spec.defaults.get(name, 0.0)))

    def choice(self, name: str) -> str:
        """A word parameter (``phase: data``): the schedule's value, or the kind's first choice."""
        return str(self.params.get(name, self.spec.choices[name][0]))

    def active(self, elapsed: float) -> bool:
        return self.at <= elapsed < self.at + self.duration

    def label(self) -> str:
        where = [w for w in (self.job, self.node) if w]
        if self.gpu is not None:
            where.append(f"gpu {self.gpu}")
        if self.device:
            where.append(self.device)
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.kind == "xid":
            where.append(f"xid {int(self.param('xid'))}")
        return f"{self.kind} ({', '.join(where)})"


def _parse_fault(index: int, raw: Mapping[str, Any]) -> Fault:
    where = f"faults[{index}]"
    if not isinstance(raw, Mapping):
        raise ScheduleError(f"{where}: expected a mapping")
    unknown = set(raw) - {"kind", "at", "duration", "node", "gpu", "device", "job", "rank", "params"}
    if unknown:
        raise ScheduleError(f"{where}: unknown keys {sorted(unknown)}")
    kind = str(raw.get("kind", ""))
    if kind not in KINDS:
        raise ScheduleError(f"{where}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
    spec = KINDS[kind]
    try:
        at = 0.0 if raw.get("at") in (None, 0, "0") else parse_seconds(raw["at"])
        duration = math.inf if raw.get("duration") is None else parse_seconds(raw["duration"])
    except ValueError as exc:
        raise ScheduleError(f"{where}: {exc}") from None
    params = dict(raw.get("params") or {})
    bad = set(params) - set(spec.defaults) - set(spec.required) - set(spec.choices)
    if bad:
        raise ScheduleError(f"{where}: {kind} takes no params {sorted(bad)}")
    for name in spec.required:
        if name not in params:
            raise ScheduleError(f"{where}: {kind} needs params.{name}")
    for name, allowed in spec.choices.items():
        if name in params and params[name] not in allowed:
            raise ScheduleError(f"{where}: {kind} params.{name} is one of {', '.join(allowed)}")
    try:
        values = {k: v if k in spec.choices else float(v) for k, v in params.items()}
    except (TypeError, ValueError):
        raise ScheduleError(f"{where}: {kind} params must be numbers (or one of the listed words)") from None
    fault = Fault(
        kind=kind, at=at, duration=duration,
        node=None if raw.get("node") is None else str(raw["node"]),
        gpu=None if raw.get("gpu") is None else int(raw["gpu"]),
        device=None if raw.get("device") is None else str(raw["device"]),
        job=None if raw.get("job") is None else str(raw["job"]),
        rank=None if raw.get("rank") is None else int(raw["rank"]),
        params=values,
    )
    needs = {
        "gpu": ("node", "gpu"), "efa": ("node",), "ena": ("node",), "node": ("node",),
        "rank": ("job", "rank"), "job": ("job",),
    }[spec.target]
    missing = [n for n in needs if getattr(fault, n) is None]
    if missing:
        raise ScheduleError(f"{where}: {kind} needs {', '.join(missing)}")
    return fault


def parse_schedule(data: Any) -> list[Fault]:
    """Faults from parsed YAML: ``{faults: [...]}`` or a bare list."""
    if data is None:
        return []
    items: Iterable[Any] = data.get("faults", []) if isinstance(data, Mapping) else data
    if not isinstance(items, list):
        raise ScheduleError("faults: expected a list")
    return sorted((_parse_fault(i, raw) for i, raw in enumerate(items)), key=lambda f: f.at)


def load_schedule(path: str) -> list[Fault]:
    import yaml

    with open(path, encoding="utf-8") as handle:
        try:
            return parse_schedule(yaml.safe_load(handle))
        except yaml.YAMLError as exc:
            raise ScheduleError(f"{path}: not valid YAML: {exc}") from None
