"""Turn metric specs plus values into ``prometheus_client`` metric families.

One family per metric name per collection: the text format rejects a second
HELP/TYPE block for the same name, so values are grouped here before output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from fleetscope.metrics import MetricSpec


class FamilyBuilder:
    """Accumulates samples for many specs and yields one family per name."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def _family(self, spec: MetricSpec) -> Metric:
        family = self._families.get(spec.name)
        if family is None:
            labels = list(spec.labels)
            if spec.kind == "counter":
                family = CounterMetricFamily(spec.name, spec.help, labels=labels)
            elif spec.kind == "gauge":
                family = GaugeMetricFamily(spec.name, spec.help, labels=labels)
            else:
                family = InfoMetricFamily(spec.name.removesuffix("_info"), spec.help, labels=labels)
            self._families[spec.name] = family
        return family

    def add(self, spec: MetricSpec, labels: Iterable[str], value: float | int | None) -> None:
        """Add one sample; ``None`` means "not read" and adds nothing (missing is not zero)."""
        if value is None:
            return
        if spec.kind == "info":
            raise TypeError(f"{spec.name} is an info metric: use add_info")
        label_values = [str(v) for v in labels]
        if len(label_values) != len(spec.labels):
            raise ValueError(f"{spec.name} takes labels {spec.labels}, got {label_values}")
        self._family(spec).add_metric(label_values, float(value) * spec.scale)

    def add_info(self, spec: MetricSpec, labels: Iterable[str], info: Mapping[str, str]) -> None:
        """Add an ``_info`` sample; every declared info key is present (empty if unknown)."""
        if spec.kind != "info":
            raise TypeError(f"{spec.name} is not an info metric")
        label_values = [str(v) for v in labels]
        if len(label_values) != len(spec.labels):
            raise ValueError(f"{spec.name} takes labels {spec.labels}, got {label_values}")
        unknown = set(info) - set(spec.info_keys)
        if unknown:
            raise ValueError(f"{spec.name} has no info keys {sorted(unknown)}")
        family = self._family(spec)
        family.add_metric(label_values, {k: str(info.get(k, "") or "") for k in spec.info_keys})

    def families(self) -> list[Metric]:
        return [f for f in self._families.values() if f.samples]
