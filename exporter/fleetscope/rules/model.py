"""Rule objects and the small PromQL helpers the rule modules share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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


def sel(settings: Settings, metric: str, matchers: str = "") -> str:
    """``metric{<target selector>, matchers}``: every raw series is read through the selector."""
    inner = ", ".join(part for part in (settings.selector, matchers) if part)
    return f"{metric}{{{inner}}}"


def num(value: float) -> str:
    """A threshold as PromQL text, without float noise (1.3333333333 -> 1.333)."""
    return f"{value:.4g}"
