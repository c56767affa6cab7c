"""Rule objects and the small PromQL helpers the rule modules share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fleetscope.rules.settings import Settings

Severity = Literal["critical", "warning", "info"]

# Labels that identify one rank's series (besides the target labels instance and job).
RANK_KEY = "instance, training_job, rank"


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


def window_suffix(settings: Settings) -> str:
    return settings.rate_window


def with_gpu(settings: Settings, expr: str) -> str:
    """Add the rank's ``gpu`` label from fleetscope_training_rank_info, keeping ranks without one."""
    info = sel(settings, "fleetscope_training_rank_info")
    return (
        f"(\n  {indent(expr)}\n)\n"
        f"  * on ({RANK_KEY}) group_left (gpu) {info}\n"
        f"or\n"
        f"(\n  {indent(expr)}\n)\n"
        f"  unless on ({RANK_KEY}) {info}"
    )


def indent(text: str, by: str = "  ") -> str:
    return text.replace("\n", "\n" + by)
