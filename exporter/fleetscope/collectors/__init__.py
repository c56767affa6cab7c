"""Collectors: turn typed readings from :mod:`fleetscope.sources` into metric families.

Each collector is one module here, registered below by name. The name is the
flag (``--collector.efa`` / ``--no-collector.efa``) and the ``collector``
label of the engine's self-metrics. Entries are import strings, resolved only
when the collector is enabled, so an optional heavy dependency (``pynvml``)
is never imported for a node that turns its collector off.

A collector class is built as ``Cls(config)`` and is a :class:`Collector`;
it states the optional capabilities it has by also subclassing
:class:`HealthCheck` (``fleetscope check``), :class:`HasRouters` (HTTP
routes on the ``"main"`` or ``"push"`` app) or :class:`Closeable`, so mypy
checks each method against its protocol and the daemon finds them with
``isinstance``, never ``hasattr``.

``live`` collectors (in-memory state such as pushed training steps) are
collected at scrape time; all others run in the background on their interval,
pausing while nothing scrapes unless ``pausable`` is off (a collector that
follows an event stream, which would overrun meanwhile).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # typing only: importing the registry must stay cheap
    from fastapi import APIRouter
    from prometheus_client.core import Metric

    from fleetscope.config import Config
    from fleetscope.health import Finding
    from fleetscope.metrics import MetricTable

App = Literal["main", "push"]


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


@dataclass(frozen=True)
class CollectorEntry:
    target: str  # "module:Class"
    help: str
    default_enabled: bool = True
    default_interval: float = 15.0
    default_timeout: float = 10.0
    live: bool = False
    pausable: bool = True

    def load(self) -> type[Collector]:
        module_name, _, attr = self.target.partition(":")
        cls: type[Collector] = getattr(importlib.import_module(module_name), attr)
        return cls


REGISTRY: dict[str, CollectorEntry] = {
    "efa": CollectorEntry("fleetscope.collectors.efa:EfaCollector", "EFA devices from sysfs"),
    "netdev": CollectorEntry("fleetscope.collectors.netdev:NetdevCollector", "network interfaces from sysfs"),
    "netstat": CollectorEntry("fleetscope.collectors.netstat:NetstatCollector", "TCP/IP counters from procfs"),
    "ena": CollectorEntry("fleetscope.collectors.ena:EnaCollector", "ENA ethtool statistics via ioctl"),
    "gpu": CollectorEntry(
        "fleetscope.collectors.gpu:GpuCollector", "NVIDIA GPUs via NVML and the kernel log",
        default_interval=10.0, default_timeout=8.0,
        pausable=False,  # it follows the kernel log: a paused reader could miss Xids the ring buffer overwrote
    ),
    "nccl": CollectorEntry(
        "fleetscope.collectors.nccl:NcclCollector", "NCCL Inspector plugin output of the node's ranks",
        default_interval=10.0, default_timeout=8.0,
        pausable=False,  # it follows growing files: a paused reader would face a backlog, or lose a truncated file
    ),
    "steps": CollectorEntry(
        "fleetscope.collectors.steps:StepsCollector", "training steps pushed by jobs", default_interval=1.0,
        default_timeout=1.0, live=True,
    ),
    "http": CollectorEntry(
        "fleetscope.collectors.http:HttpCollector", "the daemon's HTTP listeners", default_interval=1.0,
        default_timeout=1.0, live=True,
    ),
}
