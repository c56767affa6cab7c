"""Collectors: turn typed readings from :mod:`fleetscope.sources` into metric families.

Each collector is one module here, registered below by name. The name is the
flag (``--collector.efa`` / ``--no-collector.efa``) and the ``collector``
label of the engine's self-metrics. Entries are import strings, resolved only
when the collector is enabled, so an optional heavy dependency (``pynvml``)
is never imported for a node that turns its collector off.

A collector class is built as ``Cls(config)`` and provides:

* ``name: str`` and ``tables: tuple[MetricTable, ...]`` (class attribute:
  what it may export; the catalog is generated from it);
* ``collect() -> list[Metric]``: one reading, raising
  :class:`fleetscope.errors.NoHardware` when its hardware is absent;
* optionally ``health() -> list[Finding]`` for ``fleetscope check``;
* optionally ``routers() -> list[tuple[str, APIRouter]]`` adding HTTP
  routes to the ``"main"`` or ``"push"`` app;
* optionally ``close()``.

``live`` collectors (in-memory state such as pushed training steps) are
collected at scrape time; all others run in the background on their interval,
pausing while nothing scrapes unless ``pausable`` is off (a collector that
follows an event stream, which would overrun meanwhile).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CollectorEntry:
    target: str  # "module:Class"
    help: str
    default_enabled: bool = True
    default_interval: float = 15.0
    default_timeout: float = 10.0
    live: bool = False
    pausable: bool = True

    def load(self) -> type[Any]:
        module_name, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module_name), attr)


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
