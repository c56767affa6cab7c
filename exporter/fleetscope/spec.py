"""Metric tables: the one place where a raw reading gets its metric name.

Every source has a table mapping its raw names (a sysfs file, an NVML field,
a pushed field) to a :class:`MetricSpec`. Collectors build metric families
from these tables, and ``docs/metrics.md`` is generated from them, so the
catalog can never drift from what the daemon exports.

This module deliberately does not import ``prometheus_client``: sources import
it to declare their tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Literal, Mapping, Sequence

MetricKind = Literal["gauge", "counter", "info"]
NAMESPACE = "fleetscope"


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family.

    ``name`` is the full exposition name: counters end in ``_total`` and info
    metrics in ``_info``. ``scale`` converts the raw reading to the base unit
    (e.g. 1e-3 for a milliseconds reading exported as seconds). Info metrics
    carry their string facts as ``info_keys`` labels beside the identifying
    ``labels``.
    """

    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    raw: str = ""
    scale: float = 1.0
    info_keys: tuple[str, ...] = ()

    @property
    def all_labels(self) -> tuple[str, ...]:
        return self.labels + self.info_keys

    def __post_init__(self) -> None:
        if not self.name.startswith(NAMESPACE + "_"):
            raise ValueError(f"metric {self.name!r} is outside the {NAMESPACE}_ namespace")
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name!r} must end in _total")
        if self.kind == "info" and not self.name.endswith("_info"):
            raise ValueError(f"info metric {self.name!r} must end in _info")


@dataclass(frozen=True)
class MetricTable:
    """The metrics of one source, keyed by raw name (or a stable key)."""

    source: str
    description: str
    specs: Mapping[str, MetricSpec] = field(default_factory=dict)

    def __getitem__(self, key: str) -> MetricSpec:
        return self.specs[key]

    def __contains__(self, key: object) -> bool:
        return key in self.specs

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(self.specs.values())

    def get(self, key: str) -> MetricSpec | None:
        return self.specs.get(key)


def table(source: str, description: str, rows: Sequence[tuple[str, MetricSpec]]) -> MetricTable:
    """Build a table, refusing duplicate keys (a silent overwrite hides a metric)."""
    specs: dict[str, MetricSpec] = {}
    for key, spec in rows:
        if key in specs:
            raise ValueError(f"duplicate key {key!r} in metric table {source!r}")
        specs[key] = spec
    return MetricTable(source=source, description=description, specs=specs)
