"""The metric contract: every metric fleetscope exports, in one importable place.

One module per source (:mod:`.efa`, :mod:`.netdev`, :mod:`.netstat`,
:mod:`.ena`, :mod:`.gpu`, :mod:`.training`, :mod:`.push`, :mod:`.engine`, :mod:`.nccl`, :mod:`.http`),
each with one UPPER_SNAKE constant per metric (the name without
``fleetscope_<subsystem>_``, e.g. ``training.STEPS_TOTAL``) and its table.
``str(spec)`` is the metric name, so rules and dashboards write
``f"rate({training.STEPS_TOTAL}[5m])"``.

:data:`ALL_TABLES` is the catalog (``docs/metrics.md``) in order;
:func:`lookup` finds a spec by name; :mod:`.catalog` renders the catalog.
The contract imports neither ``prometheus_client`` nor any reader, so rules,
dashboards and docs can use it without the daemon's dependencies. Beside it,
:mod:`.families` and :mod:`.detail` build ``prometheus_client`` families from
the specs, for the collectors and the engine; nothing here imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from fleetscope.metrics import efa, ena, engine, gpu, http, nccl, netdev, netstat, push, training
from fleetscope.metrics.spec import NAMESPACE, MetricKind, MetricSpec, MetricTable

__all__ = [
    "ALL_TABLES",
    "BY_NAME",
    "NAMESPACE",
    "MetricKind",
    "MetricSpec",
    "MetricTable",
    "efa",
    "ena",
    "engine",
    "gpu",
    "http",
    "lookup",
    "nccl",
    "netdev",
    "netstat",
    "push",
    "training",
]

ALL_TABLES: tuple[MetricTable, ...] = (
    engine.TABLE,
    efa.TABLE,
    netdev.TABLE,
    netstat.TABLE,
    ena.TABLE,
    *gpu.TABLES,
    training.TABLE,
    training.POSITION_TABLE,
    push.TABLE,
    nccl.TABLE,
    http.TABLE,
)


def _by_name(tables: tuple[MetricTable, ...]) -> dict[str, MetricSpec]:
    """Metric name -> its first spec. A name declared twice with a different type or labels is an error."""
    metrics: dict[str, MetricSpec] = {}
    for tbl in tables:
        for spec in tbl:
            previous = metrics.setdefault(spec.name, spec)
            if (previous.kind, previous.labels) != (spec.kind, spec.labels):
                raise ValueError(f"{spec.name} is declared twice with different type or labels")
    return metrics


BY_NAME: Mapping[str, MetricSpec] = MappingProxyType(_by_name(ALL_TABLES))


def lookup(name: str) -> MetricSpec:
    """The spec of a metric by its full name; :class:`KeyError` names the metric when it is not in the contract."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a fleetscope metric (see docs/metrics.md)") from None
