"""Collectors: map typed readings from :mod:`fleetscope.sources` to metric families through the tables of
:mod:`fleetscope.metrics`.

Each collector is one module here, registered below by name. The name is the
flag (``--collector.efa`` / ``--no-collector.efa``) and the ``collector``
label of the engine's self-metrics. Entries are import strings, resolved only
when the collector is enabled, so an optional heavy dependency (``pynvml``)
is never imported for a node that turns its collector off.

What a collector class is (built as ``Cls(config)``, with its optional
capabilities) is typed in :mod:`fleetscope.collectors.protocol`.

``live`` collectors (in-memory state such as pushed training steps) are
collected at scrape time; all others run in the background on their interval,
pausing while nothing scrapes unless ``pausable`` is off (a collector that
follows an event stream, which would overrun meanwhile).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CollectorEntry:
    target: str  # "module:Class"
    help: str
    default_enabled: bool = True
    default_interval: float = 15.0
    default_timeout: float = 10.0
    live: bool = False
    pausable: bool = True
    detail_levels: bool = False  # its tables export fewer series at `default` than at `all`


REGISTRY: dict[str, CollectorEntry] = {
    "efa": CollectorEntry("fleetscope.collectors.efa:EfaCollector", "EFA devices from sysfs", detail_levels=True),
    "netdev": CollectorEntry("fleetscope.collectors.netdev:NetdevCollector", "network interfaces from sysfs"),
    "netstat": CollectorEntry("fleetscope.collectors.netstat:NetstatCollector", "TCP/IP counters from procfs"),
    "ena": CollectorEntry("fleetscope.collectors.ena:EnaCollector", "ENA ethtool statistics via ioctl"),
    "gpu": CollectorEntry(
        "fleetscope.collectors.gpu:GpuCollector", "NVIDIA GPUs via NVML and the kernel log",
        default_interval=10.0, default_timeout=8.0,
        pausable=False,  # it follows the kernel log: a paused reader could miss Xids the ring buffer overwrote
        detail_levels=True,
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
