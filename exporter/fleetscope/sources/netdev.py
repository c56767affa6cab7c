"""Network interfaces from sysfs (``class/net``): statistics, state, speed, MTU and driver.

Per-interface statistics come from ``statistics/*`` rather than
``/proc/net/dev``, which folds ``rx_missed_errors`` into its drop column:
a NIC's missed packets (ring overrun) and the stack's drops have different
causes and stay apart here. An interface is physical when it has a
``device`` link to a bus device; container-side virtual interfaces are left
out by the configured name patterns.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

from fleetscope.sources.fs import Root, Unreadable

logger = logging.getLogger(__name__)

# The files of statistics/ read per interface (not /proc/net/dev: see above).
STATISTICS = (
    "rx_bytes", "rx_packets", "rx_errors", "rx_dropped", "rx_missed_errors",
    "tx_bytes", "tx_packets", "tx_errors", "tx_dropped",
)


@dataclass(frozen=True)
class NetInterface:
    name: str
    stats: Mapping[str, int]  # statistics/<name> -> value, for the files that could be read
    operstate: str | None
    carrier_changes: int | None
    speed_mbps: int | None  # None when down or unknown (the file reads EINVAL or -1)
    mtu: int | None
    address: str
    driver: str
    physical: bool  # has a bus device (PCI function) behind it

    @property
    def up(self) -> bool:
        return self.operstate == "up"


def _int_or_none(sysfs: Root, *parts: str) -> int | None:
    try:
        return sysfs.read_int(*parts)
    except Unreadable:
        return None


def parse_speed(value: int | None) -> int | None:
    """The kernel writes -1 (or a huge unsigned) for an unknown speed."""
    if value is None or value <= 0 or value >= 0xFFFFFFFF:
        return None
    return value


def select_interfaces(names: list[str], include: str, exclude: str) -> list[str]:
    """Names matching ``include`` (all if empty) and not ``exclude`` (none if empty).

    Patterns are searched, as node_exporter's device filters are: anchor them to match whole names.
    """
    including = re.compile(include) if include else None
    excluding = re.compile(exclude) if exclude else None
    return [
        n
        for n in names
        if (including is None or including.search(n)) and not (excluding and excluding.search(n))
    ]


def _read_interface(sysfs: Root, name: str) -> NetInterface | None:
    base = ("class", "net", name)
    stats: dict[str, int] = {}
    for stat in STATISTICS:
        try:
            stats[stat] = sysfs.read_int(*base, "statistics", stat)
        except Unreadable as exc:
            logger.debug("skipping %s/%s: %s", name, stat, exc)
    interface = NetInterface(
        name=name,
        stats=stats,
        operstate=sysfs.read_attr_or_none(*base, "operstate"),
        carrier_changes=_int_or_none(sysfs, *base, "carrier_changes"),
        speed_mbps=parse_speed(_int_or_none(sysfs, *base, "speed")),
        mtu=_int_or_none(sysfs, *base, "mtu"),
        address=sysfs.read_attr_or_none(*base, "address") or "",
        driver=sysfs.link_target(*base, "device", "driver") or "",
        physical=sysfs.exists(*base, "device"),
    )
    if not sysfs.exists(*base):
        logger.debug("interface %s vanished while being read", name)
        return None
    return interface


def read_netdev(sysfs: Root, include: str = "", exclude: str = "") -> tuple[NetInterface, ...]:
    """Interfaces under ``class/net`` selected by the name patterns."""
    names = select_interfaces(sysfs.listdir("class", "net"), include, exclude)
    return tuple(i for i in (_read_interface(sysfs, n) for n in names) if i is not None)
