"""Network interfaces from sysfs (``class/net``), and the NIC metric table.

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
from fleetscope.spec import MetricSpec, table

logger = logging.getLogger("fleetscope.sources.netdev")

_DEVICE = ("device",)


def _stat(raw: str, name: str, help: str, unit: str = "") -> tuple[str, MetricSpec]:
    return raw, MetricSpec(name, "counter", help, _DEVICE, unit=unit, raw=f"statistics/{raw}")


NETDEV_TABLE = table(
    "netdev",
    "Network interfaces from `/sys/class/net/<device>/`. Interfaces matching `net.device-exclude` "
    "(container-side virtual interfaces by default) are not reported.",
    [
        _stat("rx_bytes", "fleetscope_net_receive_bytes_total", "Bytes received.", "bytes"),
        _stat("rx_packets", "fleetscope_net_receive_packets_total", "Packets received."),
        _stat("rx_errors", "fleetscope_net_receive_errors_total", "Receive errors (all kinds)."),
        _stat(
            "rx_dropped",
            "fleetscope_net_receive_dropped_total",
            "Received packets dropped by the stack (no buffer, unknown protocol, filtered).",
        ),
        _stat(
            "rx_missed_errors",
            "fleetscope_net_receive_missed_total",
            "Packets the NIC missed because its receive ring was full (host too slow).",
        ),
        _stat("tx_bytes", "fleetscope_net_transmit_bytes_total", "Bytes transmitted.", "bytes"),
        _stat("tx_packets", "fleetscope_net_transmit_packets_total", "Packets transmitted."),
        _stat("tx_errors", "fleetscope_net_transmit_errors_total", "Transmit errors (all kinds)."),
        _stat("tx_dropped", "fleetscope_net_transmit_dropped_total", "Packets dropped on transmit."),
        (
            "carrier_changes",
            MetricSpec(
                "fleetscope_net_carrier_changes_total",
                "counter",
                "Times the link went up or down.",
                _DEVICE,
                raw="carrier_changes",
            ),
        ),
        (
            "up",
            MetricSpec(
                "fleetscope_net_up",
                "gauge",
                "1 if the interface's operstate is up, 0 otherwise.",
                _DEVICE,
                raw="operstate",
            ),
        ),
        (
            "speed",
            MetricSpec(
                "fleetscope_net_speed_bytes_per_second",
                "gauge",
                "Link speed (absent when the driver does not report one).",
                _DEVICE,
                unit="bytes/second",
                raw="speed",
                scale=1e6 / 8,
            ),
        ),
        (
            "mtu",
            MetricSpec(
                "fleetscope_net_mtu_bytes", "gauge", "MTU of the interface.", _DEVICE, unit="bytes", raw="mtu"
            ),
        ),
        (
            "info",
            MetricSpec(
                "fleetscope_net_info",
                "info",
                "One interface: its state, hardware address and driver.",
                _DEVICE,
                info_keys=("operstate", "address", "driver"),
            ),
        ),
    ],
)
STATISTICS = tuple(k for k, s in NETDEV_TABLE.specs.items() if s.raw == f"statistics/{k}")


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
