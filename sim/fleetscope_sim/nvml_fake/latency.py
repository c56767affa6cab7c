"""What the native NVML library's calls cost, for the fake to book (#25).

A real NVML call takes time in the driver: on an H100 (driver 580) ``nvmlDeviceGetMaxClockInfo`` 1.7 ms,
``nvmlDeviceGetPcieThroughput`` 21 ms, most field values 2-8 µs but the energy counter 3.5 ms, the PCIe
counters 0.1-0.3 ms each. The fake answers in
microseconds of Python. With a :class:`LatencyModel` it books each call the time the real library took
for it, on a virtual clock per thread that a benchmark reads (:meth:`FakeNvml.booked`): the collector's
cost per cycle on the model is its own CPU time plus the NVML time booked. Nothing sleeps, so a test or
the simulator's hundreds of fake GPUs cost no more wall time with a model than without, and a loaded CI
machine cannot change the figure. Tests assert what the collector calls (``FakeNvml.calls``,
``FakeNvml.fields_asked``), never how long it took.

A model is YAML (``scenarios/latency/<name>.yaml``, or inline under a scenario's ``latency:``)::

    calls_us: {nvmlDeviceGetPowerUsage: 3.2, ...}      # steady cost of a call
    first_calls_us: {nvmlInitWithFlags: 10995, ...}    # its first call per GPU (per process without one)
    fields_us: {83: 3446.4, ...}   # nvmlDeviceGetFieldValues: per field id answered
    field_us: 232.5      # an answered field with no figure of its own
    refused_field_us: 6.4   # a field the driver refuses (NOT_SUPPORTED, NO_PERMISSION, ...); default: field_us
    default_us: 50.0     # a symbol with no figure
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

LATENCY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios", "latency")
FIELD_VALUES = "nvmlDeviceGetFieldValues"


@dataclass(frozen=True)
class LatencyModel:
    """Microseconds per native call (steady and first), per field value (by id, answered or refused), and for
    a symbol or a field without a figure."""

    name: str
    calls_us: Mapping[str, float] = field(default_factory=dict)
    first_calls_us: Mapping[str, float] = field(default_factory=dict)
    field_us: float = 0.0  # an answered field without a figure of its own
    default_us: float = 0.0
    description: str = ""
    fields_us: Mapping[int, float] = field(default_factory=dict)  # field id -> µs, answered
    refused_field_us: float | None = None  # a refused field (None: as field_us)

    def call_us(self, symbol: str, first: bool = False) -> float:
        """One call of ``symbol`` (field values: the call alone, without its fields)."""
        if first and symbol in self.first_calls_us:
            return float(self.first_calls_us[symbol])
        if symbol == FIELD_VALUES:
            return float(self.calls_us.get(symbol, 0.0))
        return float(self.calls_us.get(symbol, self.default_us))

    def field_cost_us(self, field_id: int, answered: bool = True) -> float:
        """One field value within ``nvmlDeviceGetFieldValues``: what the driver takes to answer it, or to refuse it."""
        if not answered:
            return self.field_us if self.refused_field_us is None else self.refused_field_us
        return float(self.fields_us.get(field_id, self.field_us))

    def cost_us(self, symbol: str, first: bool = False, fields: Iterable[tuple[int, bool]] = ()) -> float:
        """One call; ``fields``: the (field id, answered) pairs a field-value call asked."""
        return self.call_us(symbol, first) + sum(self.field_cost_us(f, answered) for f, answered in fields)

    @classmethod
    def named(cls, name: str) -> LatencyModel:
        """A shipped model (``scenarios/latency/<name>.yaml``) or a model file's path."""
        import yaml

        path = name if os.path.sep in name else os.path.join(LATENCY_DIR, f"{name}.yaml")
        if not os.path.isfile(path):
            known = sorted(n[:-5] for n in os.listdir(LATENCY_DIR) if n.endswith(".yaml"))
            raise ValueError(f"no latency model {name!r} (shipped: {', '.join(known)})")
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
        return cls.from_data(data, os.path.basename(path).removesuffix(".yaml"))

    @classmethod
    def from_data(cls, data: Mapping[str, Any], name: str = "inline") -> LatencyModel:
        unknown = set(data) - {"description", "calls_us", "first_calls_us", "field_us", "fields_us",
                               "refused_field_us", "default_us"}
        if unknown:
            raise ValueError(f"latency model {name}: unknown keys {sorted(unknown)}")
        refused = data.get("refused_field_us")
        return cls(name, {str(k): float(v) for k, v in (data.get("calls_us") or {}).items()},
                   {str(k): float(v) for k, v in (data.get("first_calls_us") or {}).items()},
                   float(data.get("field_us", 0.0)), float(data.get("default_us", 0.0)),
                   str(data.get("description", "")),
                   {int(k): float(v) for k, v in (data.get("fields_us") or {}).items()},
                   None if refused is None else float(refused))

    @classmethod
    def of(cls, spec: str | Mapping[str, Any]) -> LatencyModel:
        """A scenario's ``latency:``: a model's name, or the model itself."""
        return cls.named(spec) if isinstance(spec, str) else cls.from_data(spec)

    @classmethod
    def from_capture(cls, nvml_calls: Mapping[str, Mapping[str, float]], name: str = "capture") -> LatencyModel:
        """What ``fleetscope capture`` timed on its node (``manifest.json``'s ``nvml_calls``: each symbol's calls
        and milliseconds). The capture calls each entry point once or a few times, so these are first calls,
        its thread hand-off (about 0.07 ms) included; field values are timed per call, not per field."""
        per_call = {symbol: float(entry["ms"]) * 1000 / max(float(entry["calls"]), 1.0)
                    for symbol, entry in nvml_calls.items()}
        return cls(name, per_call, {}, 0.0, min(per_call.values(), default=0.0),
                   "first calls as the capture timed them on its node")


@dataclass
class Booked:
    """What one thread's calls cost: the modelled NVML time, and the fake's own CPU time answering them."""

    modelled_seconds: float = 0.0
    own_seconds: float = 0.0
    calls: int = 0
