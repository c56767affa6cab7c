"""The collector contract, typed: what the engine, the daemon and ``fleetscope check`` may rely on.

A collector class is built as ``Cls(config)`` and is a :class:`Collector`. It
states the optional capabilities it has by also subclassing
:class:`HealthCheck` (``fleetscope check``), :class:`HasRouters` (HTTP routes
on the ``"main"`` or ``"push"`` app), :class:`Versioned` (a live collector
whose series can be reused while unchanged) or :class:`Closeable`, so mypy
checks each method against its protocol and the daemon finds capabilities
with ``isinstance``, never ``hasattr``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # typing only: the daemon's heavy parts stay unimported until used
    from fastapi import APIRouter
    from prometheus_client.core import Metric

    from fleetscope.collectors import CollectorEntry
    from fleetscope.config import Config
    from fleetscope.metrics import MetricTable

App = Literal["main", "push"]
Severity = Literal["unhealthy", "warning", "unknown"]


@dataclass(frozen=True)
class Finding:
    """One line of ``fleetscope check``: what a health check found (``check`` turns them into its exit code)."""

    collector: str
    severity: Severity
    subject: str  # what the finding is about: "efa rdmap79s0", "gpu 3", "node"; empty for the node as a whole
    message: str

    def line(self) -> str:
        """``UNHEALTHY gpu: gpu 3: ...``: one line, whatever a label value or a log record put in the message."""
        about = f"{one_line(self.subject)}: " if self.subject else ""
        return f"{self.severity.upper()} {self.collector}: {about}{one_line(self.message)}"


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (line breaks, other control characters, Unicode
    line separators and direction overrides) as a space, and runs of spaces as one.

    A finding's text reaches ``check``'s output, the verdict files, a node condition and Slurm's drain reason,
    all read line by line: a newline in a pushed job name or a log record must not add a line of its own.
    """
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


@runtime_checkable
class Collector(Protocol):
    """What every collector is: built from the config, a name, the tables it may export, one reading."""

    name: ClassVar[str]
    tables: ClassVar[tuple[MetricTable, ...]]

    def __init__(self, config: Config) -> None: ...

    def collect(self) -> Iterable[Metric]:
        """One reading; raises :class:`fleetscope.errors.NoHardware` when the hardware is absent."""
        ...


@runtime_checkable
class HealthCheck(Protocol):
    """A collector that can tell whether its hardware is healthy (``fleetscope check``)."""

    def health(self) -> list[Finding]: ...


@runtime_checkable
class HasRouters(Protocol):
    """A collector that serves HTTP routes, each on the ``"main"`` or ``"push"`` app."""

    def routers(self) -> list[tuple[App, APIRouter]]: ...


@runtime_checkable
class Versioned(Protocol):
    """A live collector that tells cheaply whether its series changed: a value that differs when they did."""

    def generation(self) -> object: ...


@runtime_checkable
class Closeable(Protocol):
    """A collector holding a resource (a library session, a file) to release at shutdown."""

    def close(self) -> None: ...


def collector_class(entry: CollectorEntry) -> type[Collector]:
    """The class an entry of the registry names, imported now."""
    module_name, _, attr = entry.target.partition(":")
    cls: type[Collector] = getattr(importlib.import_module(module_name), attr)
    return cls
