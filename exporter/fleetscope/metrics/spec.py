"""MetricSpec and MetricTable: what one exported metric is, and how a source's raw names map to them.

A :class:`MetricSpec` is one metric family: full name, type, labels, unit,
help, where its value comes from (``raw``) and the scale to its base unit.
``str(spec)`` is its name, so PromQL written in Python reads
``f"rate({training.STEPS_TOTAL}[5m])"`` and a renamed metric breaks at import,
not in production.

A metric can cost fewer series at the ``default`` detail level than at
``all`` (:class:`AtDefault`): per-device counters summed per node, per-link
states folded per GPU, or left out until asked for. Each collector's level is
``--collector.<name>.detail``; the catalog lists what each level exports.

A :class:`MetricTable` maps the raw names of one source (a sysfs counter file,
an ethtool statistic, an NVML reading) to specs. Collectors look readings up
in it; ``docs/metrics.md`` is rendered from it.

Neither ``prometheus_client`` nor any reader is imported here: rules,
dashboards and docs import the contract without the daemon.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

MetricKind = Literal["gauge", "counter", "info"]
NAMESPACE = "fleetscope"

DetailLevel = Literal["default", "all"]
DETAIL_LEVELS: tuple[DetailLevel, ...] = ("default", "all")
Combine = Literal["sum", "min", "max"]


@dataclass(frozen=True)
class AtDefault:
    """How a metric is exported at the ``default`` detail level, where that is less than at ``all``.

    ``keep`` are the labels it keeps there; series that differ only in the
    other labels are combined into one: counters summed (kept monotonic across
    a device's reset or disappearance, see :mod:`fleetscope.metrics.detail`), gauges by
    ``combine``. ``keep=None``: exported only at ``all``. ``unless`` names a
    metric with the same labels: a series is left out at ``default`` where that
    metric has one (it carries the same signal better). ``why`` is the reason,
    for the catalog.
    """

    keep: tuple[str, ...] | None
    combine: Combine = "sum"
    unless: str = ""
    why: str = ""

    def combined_over(self, labels: tuple[str, ...]) -> str:
        """``summed over device, port`` for a metric with ``labels``: how its series are combined."""
        dropped = ", ".join(label for label in labels if label not in (self.keep or ()))
        how = {"sum": "summed", "min": "lowest", "max": "highest"}[self.combine]
        return f"{how} over {dropped}"


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
    at_default: AtDefault | None = None  # None: the same series at every detail level

    def __post_init__(self) -> None:
        if not self.name.startswith(NAMESPACE + "_"):
            raise ValueError(f"metric {self.name!r} is outside the {NAMESPACE}_ namespace")
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name!r} must end in _total")
        if self.kind == "info" and not self.name.endswith("_info"):
            raise ValueError(f"info metric {self.name!r} must end in _info")
        reduced = self.at_default
        if reduced is not None and reduced.keep is not None:
            if not set(reduced.keep) <= set(self.labels):
                raise ValueError(f"{self.name}: keeps labels {reduced.keep} it does not have")
            if self.kind == "info" and reduced.keep != self.labels:
                raise ValueError(f"{self.name}: an info metric cannot be combined")
            if self.kind == "counter" and reduced.combine != "sum":
                raise ValueError(f"{self.name}: counters are combined by sum")

    def __str__(self) -> str:
        return self.name

    @property
    def all_labels(self) -> tuple[str, ...]:
        return self.labels + self.info_keys

    def labels_at(self, level: DetailLevel) -> tuple[str, ...] | None:
        """The labels its series carry at ``level``; None when it is not exported there."""
        if level == "all" or self.at_default is None:
            return self.labels
        return self.at_default.keep

    def from_raw(self, raw: str) -> MetricSpec:
        """The same metric read from another raw source (one family fed by several counters)."""
        return replace(self, raw=raw)


@dataclass(frozen=True)
class MetricTable:
    """The metrics of one source, keyed by raw name (or a stable key), exported by ``collector``."""

    source: str
    description: str
    specs: Mapping[str, MetricSpec] = field(default_factory=dict)
    collector: str = ""

    def __getitem__(self, key: str) -> MetricSpec:
        return self.specs[key]

    def __contains__(self, key: object) -> bool:
        return key in self.specs

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(self.specs.values())

    def get(self, key: str) -> MetricSpec | None:
        return self.specs.get(key)


def table(
    source: str, description: str, rows: Sequence[tuple[str, MetricSpec]], *, collector: str = ""
) -> MetricTable:
    """Build a table, refusing duplicate keys (a silent overwrite hides a metric).

    ``collector`` is the collector that exports it (the source's name when not given).
    """
    specs: dict[str, MetricSpec] = {}
    for key, spec in rows:
        if key in specs:
            raise ValueError(f"duplicate key {key!r} in metric table {source!r}")
        specs[key] = spec
    return MetricTable(source=source, description=description, specs=specs, collector=collector or source)
