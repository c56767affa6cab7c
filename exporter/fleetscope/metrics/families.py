"""Turn metric specs plus values into ``prometheus_client`` metric families.

One family per metric name per collection: the text format rejects a second
HELP/TYPE block for the same name, so values are grouped here before output.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from fleetscope.metrics import MetricSpec

logger = logging.getLogger(__name__)


class FamilyBuilder:
    """Accumulates samples for many specs and yields one family per name."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}  # every family, in the order first added
        self._values: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        self._infos: dict[str, InfoMetricFamily] = {}

    def _value_family(self, spec: MetricSpec) -> CounterMetricFamily | GaugeMetricFamily:
        family = self._values.get(spec.name)
        if family is None:
            kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = self._values[spec.name] = kind(spec.name, spec.help, labels=list(spec.labels))
            self._families[spec.name] = family
        return family

    def _info_family(self, spec: MetricSpec) -> InfoMetricFamily:
        family = self._infos.get(spec.name)
        if family is None:
            name = spec.name.removesuffix("_info")
            family = self._infos[spec.name] = InfoMetricFamily(name, spec.help, labels=list(spec.labels))
            self._families[spec.name] = family
        return family

    def add(self, spec: MetricSpec, labels: Iterable[str], value: float | int | None) -> None:
        """Add one sample; ``None`` means "not read" and adds nothing (missing is not zero)."""
        if value is None:
            return
        if spec.kind == "info":
            raise TypeError(f"{spec.name} is an info metric: use add_info")
        label_values = list(map(str, labels))
        if len(label_values) != len(spec.labels):
            raise ValueError(f"{spec.name} takes labels {spec.labels}, got {label_values}")
        try:
            number = float(value) * spec.scale
        except OverflowError:  # an integer no float can hold: garbage from the source, dropped alone
            logger.debug("%s%s: the value does not fit a float", spec.name, label_values)
            return
        self._value_family(spec).add_metric(label_values, number)

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
        self._info_family(spec).add_metric(label_values, {k: str(info.get(k, "") or "") for k in spec.info_keys})

    def families(self) -> list[Metric]:
        return [f for f in self._families.values() if f.samples]
