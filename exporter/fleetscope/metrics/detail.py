"""Detail levels: what a collector exports at ``default`` and at ``all``.

A metric whose spec has :attr:`~fleetscope.metrics.MetricSpec.at_default`
costs fewer series at the ``default`` level: series that differ only in the
labels it drops are combined into one (per-device counters summed per node,
per-link states folded per GPU), or it is left out until ``all`` is asked for.
A collector keeps one :class:`Detail` for its life and builds each collection
with :meth:`Detail.builder`.

A summed counter must stay a counter. A plain sum drops when one device
resets or disappears, and Prometheus would read that drop as a reset of the
whole sum and count the rest of it again (a false burst of drops or bytes).
So each series' value is carried: a reset adds its last value to an offset,
and a series that is not read any more keeps contributing its last total.
Only a restart of the daemon itself starts the sums afresh, as it starts
every counter of a node whose devices reset meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from prometheus_client.core import Metric

from fleetscope.metrics import MetricSpec
from fleetscope.metrics.families import FamilyBuilder
from fleetscope.metrics.spec import DetailLevel

SeriesKey = tuple[str, tuple[str, ...]]  # metric name, label values


@dataclass
class _Carried:
    """One per-device counter series folded into a sum: its last value and what resets took from it."""

    spec: MetricSpec
    labels: tuple[str, ...]
    last: float
    offset: float = 0.0

    @property
    def total(self) -> float:
        return self.offset + self.last


class Detail:
    """One collector's detail level, and the state its summed counters carry from one collection to the next."""

    def __init__(self, level: DetailLevel = "all") -> None:
        self.level = level
        self._carried: dict[SeriesKey, _Carried] = {}
        self._exported: dict[SeriesKey, float] = {}
        self._as_exported: dict[tuple[str, bool], MetricSpec] = {}

    def builder(self) -> FamilyBuilder:
        """A builder for one collection: a plain one at ``all``, one that combines series at ``default``."""
        if self.level == "all":
            return FamilyBuilder()
        return _DefaultBuilder(self)

    def carry(self, spec: MetricSpec, labels: tuple[str, ...], value: float) -> None:
        """Fold one reading of a per-device counter series (called by this collection's builder)."""
        key = (spec.name, labels)
        carried = self._carried.get(key)
        if carried is None:
            self._carried[key] = _Carried(spec, labels, value)
            return
        if value < carried.last:  # the device's counter reset (driver reload, device re-probed)
            carried.offset += carried.last
        carried.last = value

    def carried(self) -> Iterable[_Carried]:
        """Every counter series ever folded, read this collection or not."""
        return self._carried.values()

    def as_exported(self, spec: MetricSpec, combined: bool) -> MetricSpec:
        """``spec`` as exported at ``default``, made once a spec (a collection exports it once a series): with
        ``combined``, its kept labels and a help text that says what was combined; otherwise as it is."""
        key = (spec.name, combined)
        exported = self._as_exported.get(key)
        if exported is None:
            if combined:
                reduced = spec.at_default
                assert reduced is not None and reduced.keep is not None
                help = f"{spec.help} At detail level default: {reduced.combined_over(spec.labels)}."
                exported = replace(spec, labels=reduced.keep, help=help, at_default=None)
            else:
                exported = replace(spec, at_default=None)
            self._as_exported[key] = exported
        return exported

    def monotonic(self, key: SeriesKey, value: float) -> float:
        """Never below what was exported before (a sum in another order can round an ulp lower)."""
        value = max(value, self._exported.get(key, value))
        self._exported[key] = value
        return value


def _family_name(spec: MetricSpec) -> str:
    """The name ``prometheus_client`` gives the family of ``spec`` (without ``_total`` or ``_info``)."""
    if spec.kind == "counter":
        return spec.name.removesuffix("_total")
    if spec.kind == "info":
        return spec.name.removesuffix("_info")
    return spec.name


def _project(spec: MetricSpec, keep: tuple[str, ...], labels: tuple[str, ...]) -> tuple[str, ...]:
    positions = [spec.labels.index(label) for label in keep]
    return tuple(labels[i] for i in positions)


class _DefaultBuilder(FamilyBuilder):
    """A :class:`FamilyBuilder` that exports each spec as its ``at_default`` says, in the order first added."""

    def __init__(self, detail: Detail) -> None:
        super().__init__()
        self._detail = detail
        self._order: dict[str, int] = {}
        self._gauges: dict[str, dict[tuple[str, ...], list[float]]] = {}
        self._counters: set[str] = set()
        self._specs: dict[str, MetricSpec] = {}
        self._deferred: list[tuple[MetricSpec, tuple[str, ...], float]] = []
        self._plain_labels: dict[str, set[tuple[str, ...]]] = {}

    def _note(self, spec: MetricSpec) -> None:
        if spec.name not in self._specs:  # once a spec: this runs for every sample a collector adds
            self._order.setdefault(_family_name(spec), len(self._order))
            self._specs[spec.name] = spec

    def add(self, spec: MetricSpec, labels: Iterable[str], value: float | int | None) -> None:
        if value is None:
            return
        label_values = tuple(map(str, labels))
        reduced = spec.at_default
        if reduced is None or (reduced.keep == spec.labels and not reduced.unless):
            self._note(spec)
            plain = self._plain_labels.get(spec.name)
            if plain is None:
                plain = self._plain_labels[spec.name] = set()
            plain.add(label_values)
            super().add(spec, label_values, value)
            return
        if reduced.keep is None:
            return
        if len(label_values) != len(spec.labels):
            raise ValueError(f"{spec.name} takes labels {spec.labels}, got {list(label_values)}")
        self._note(spec)
        if reduced.unless:
            self._deferred.append((spec, label_values, float(value)))
        elif spec.kind == "counter":
            self._counters.add(spec.name)
            self._detail.carry(spec, label_values, float(value))
        else:
            key = _project(spec, reduced.keep, label_values)
            self._gauges.setdefault(spec.name, {}).setdefault(key, []).append(float(value))

    def add_info(self, spec: MetricSpec, labels: Iterable[str], info: Mapping[str, str]) -> None:
        if spec.at_default is not None and spec.at_default.keep is None:
            return
        self._note(spec)
        super().add_info(spec, labels, info)

    def families(self) -> list[Metric]:
        sums: dict[str, dict[tuple[str, ...], list[float]]] = {}
        for carried in self._detail.carried():
            spec = carried.spec
            if spec.name not in self._counters:
                continue  # read on no device this time: absent, as its per-device series would be
            assert spec.at_default is not None and spec.at_default.keep is not None
            key = _project(spec, spec.at_default.keep, carried.labels)
            sums.setdefault(spec.name, {}).setdefault(key, []).append(carried.total)
        for name, groups in sums.items():
            spec = self._specs[name]
            for key, totals in groups.items():
                value = self._detail.monotonic((name, key), math.fsum(totals))
                super().add(self._detail.as_exported(spec, combined=True), key, value)
        for name, gauge_groups in self._gauges.items():
            spec = self._specs[name]
            assert spec.at_default is not None
            combine = spec.at_default.combine
            for key, values in gauge_groups.items():
                value = math.fsum(values) if combine == "sum" else min(values) if combine == "min" else max(values)
                super().add(self._detail.as_exported(spec, combined=True), key, value)
        for spec, labels, value in self._deferred:
            assert spec.at_default is not None
            if labels not in self._plain_labels.get(spec.at_default.unless, set()):
                super().add(self._detail.as_exported(spec, combined=False), labels, value)
        built = super().families()
        return sorted(built, key=lambda family: self._order.get(family.name, len(self._order)))
