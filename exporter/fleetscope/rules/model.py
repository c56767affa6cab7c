"""Rule objects and the small PromQL helpers the rule modules share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fleetscope.metrics import MetricSpec, lookup
from fleetscope.rules.settings import Settings

Severity = Literal["critical", "warning", "info"]

@dataclass(frozen=True)
class Record:
    record: str  # level:metric:operations
    expr: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Alert:
    alert: str
    expr: str
    severity: Severity
    summary: str
    description: str
    for_: str = ""
    labels: dict[str, str] = field(default_factory=dict)


Rule = Record | Alert


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Rule, ...]
    interval: str = ""  # empty: the settings' evaluation_interval


# Series Prometheus adds to every target; everything else a rule reads raw is in the metric contract.
PROMETHEUS_SERIES = frozenset({"up"})


def sel(settings: Settings, metric: MetricSpec | str, matchers: str = "") -> str:
    """``metric{<target selector>, matchers}``: every raw series is read through the selector.

    ``metric`` is a spec of :mod:`fleetscope.metrics` (or its name, checked against the contract):
    a rule cannot read a metric the daemon does not export.
    """
    name = str(metric)
    if name not in PROMETHEUS_SERIES:
        lookup(name)
    inner = ", ".join(part for part in (settings.selector, matchers) if part)
    return f"{name}{{{inner}}}"


def held(settings: Settings, metric: MetricSpec | str, matchers: str = "") -> str:
    """A raw series read at an instant, held over ``scrape_gap_window``.

    A failed scrape marks every series of its target stale, so a bare selector returns nothing until the
    next good scrape: a pending ``for:`` would start again and a firing alert resolve (and re-fire). The
    latest sample within the window bridges one missed scrape; a series really gone ends a window later.
    """
    return f"last_over_time({sel(settings, metric, matchers)}[{settings.scrape_gap_window}])"


def new_or_increased(settings: Settings, counter: str, window: str) -> str:
    """The counter grew within ``window``, or its series is new (a first Xid creates its series at 1).

    New: present now (held over a missed scrape) and without a sample in the window before. Not
    ``counter unless counter offset window``, whose instant look-up lands in any scrape gap ``window``
    later and calls every old series new again.
    """
    return (
        f"increase({counter}[{window}]) > 0\n"
        f"or\n"
        f"(\n  last_over_time({counter}[{settings.scrape_gap_window}])\n    unless\n"
        f"  last_over_time({counter}[{window}] offset {window})\n)"
    )


def num(value: float) -> str:
    """A threshold as PromQL text, without float noise (1.3333333333 -> 1.333)."""
    return f"{value:.4g}"
