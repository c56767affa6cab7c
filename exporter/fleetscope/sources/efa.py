"""EFA devices from sysfs (``class/infiniband``): devices, ports and their counter files.

An RDMA device is EFA when its PCI function's vendor is Amazon (0x1d0f):
names are ``rdmap<bus>s<slot>`` with rdma-core's udev rule and ``efa_N``
without it, and other RDMA devices (mlx5) share the class directory.

Counters live in two places since the 2021 driver split: traffic, RDMA and
SRD counters in ``ports/<n>/hw_counters/``, admin and verbs error counters in
the device's ``hw_counters/``. Older drivers put one flat list of 25 counters
in both; the reading keeps what each directory held, and the collector, which
knows which counter belongs where, keeps each in its own scope once. Both
directories are listed rather than probed, so every counter file the driver
has is in the reading, and one the driver lacks stays absent.
Every file of a directory is read in one pass: a stale read makes the driver
query the device, and values are cached only for ``lifespan`` ms.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from fleetscope.sources.fs import Root, Unreadable

logger = logging.getLogger(__name__)
T = TypeVar("T")

AMAZON_PCI_VENDOR = 0x1D0F
LIFESPAN = "lifespan"  # the counters' cache time in ms: a setting, not a counter

@dataclass(frozen=True)
class CounterSet:
    """What one ``hw_counters`` directory held."""

    present: bool  # the directory exists (it does not outside the init network namespace)
    values: Mapping[str, int] = field(default_factory=dict)
    unreadable: tuple[str, ...] = ()  # files listed but not readable as a number
    lifespan_ms: int | None = None


@dataclass(frozen=True)
class EfaPort:
    number: int
    state: str | None  # "ACTIVE" from "4: ACTIVE"
    phys_state: str | None
    rate_bytes_per_second: float | None
    link_layer: str | None
    counters: CounterSet


@dataclass(frozen=True)
class EfaDevice:
    name: str
    pci_address: str
    pci_device_id: str
    numa_node: int | None
    node_guid: str
    fw_version: str
    counters: CounterSet
    ports: tuple[EfaPort, ...]


@dataclass(frozen=True)
class UnreadableDevice:
    name: str
    reason: str


@dataclass(frozen=True)
class EfaReading:
    devices: tuple[EfaDevice, ...]
    rdma_devices: int  # every device in class/infiniband, EFA or not
    class_present: bool  # class/infiniband exists at all (the ib_core module is loaded)
    unreadable: tuple[UnreadableDevice, ...] = ()  # EFA devices whose directories could not be read


# -- parsers: text in, value out; each raises ValueError on text it does not understand -----------


MAX_COUNTER = (1 << 64) - 1  # the driver's counters are u64


def parse_counter(text: str) -> int:
    """One hw_counters file: an unsigned 64-bit decimal. ``N/A (no PMA)``, garbage and overflow are refused."""
    if not text.isdigit():
        raise ValueError(f"not a counter value: {text[:40]!r}")
    value = int(text)
    if value > MAX_COUNTER:
        raise ValueError(f"not a 64-bit counter: {text[:40]!r}")
    return value


def parse_state(text: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    number, sep, name = text.partition(":")
    if not sep or not number.strip().isdigit() or not name.strip():
        raise ValueError(f"not a port state: {text[:40]!r}")
    return name.strip()


def parse_rate(text: str) -> float:
    """``100 Gb/sec (4X EDR)`` -> bytes per second (12.5e9)."""
    number, _, rest = text.partition(" ")
    if not rest.startswith("Gb/sec"):
        raise ValueError(f"not a link rate: {text[:40]!r}")
    return float(number) * 1e9 / 8


def parse_hex_id(text: str) -> int:
    """``0x1d0f`` -> 0x1d0f."""
    if not text.lower().startswith("0x"):
        raise ValueError(f"not a PCI id: {text[:40]!r}")
    return int(text, 16)


# -- reading ----------------------------------------------------------------------------------------


def _counter(data: bytes | None) -> int | None:
    """:func:`parse_counter` on a file's raw bytes (no decoding); None for anything it would refuse."""
    if data is None:
        return None
    try:
        return parse_counter(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None


def _read_counters(sysfs: Root, *parts: str) -> CounterSet:
    contents = sysfs.read_attrs(*parts)
    if contents is None:
        return CounterSet(present=False)
    values: dict[str, int] = {}
    unreadable: list[str] = []
    lifespan: int | None = None
    for name, data in contents.items():
        value = _counter(data)
        if value is None:
            logger.debug("skipping %s: %s", "/".join((*parts, name)),
                         "unreadable" if data is None else f"not a counter value: {data[:40]!r}")
            if name != LIFESPAN:  # a setting, not one of the counters
                unreadable.append(name)
        elif name == LIFESPAN:
            lifespan = value
        else:
            values[name] = value
    return CounterSet(True, values, tuple(unreadable), lifespan)


def _optional(sysfs: Root, parse: Callable[[str], T], *parts: str) -> T | None:
    """An attribute parsed, or None when it is absent, unreadable or not understood."""
    text = sysfs.read_attr_or_none(*parts)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:
        return None


def _read_port(sysfs: Root, device: str, number: int) -> EfaPort:
    base = ("class", "infiniband", device, "ports", str(number))
    return EfaPort(
        number=number,
        state=_optional(sysfs, parse_state, *base, "state"),
        phys_state=_optional(sysfs, parse_state, *base, "phys_state"),
        rate_bytes_per_second=_optional(sysfs, parse_rate, *base, "rate"),
        link_layer=sysfs.read_attr_or_none(*base, "link_layer"),
        counters=_read_counters(sysfs, *base, "hw_counters"),
    )


def _read_device(sysfs: Root, name: str) -> EfaDevice | None:
    """One EFA device, or None if it is not EFA or vanished while being read."""
    base = ("class", "infiniband", name)
    try:
        vendor = parse_hex_id(sysfs.read_attr(*base, "device", "vendor"))
    except (Unreadable, ValueError):
        return None
    if vendor != AMAZON_PCI_VENDOR:
        return None
    ports = tuple(
        _read_port(sysfs, name, int(number)) for number in sysfs.listdir(*base, "ports") if number.isdigit()
    )
    device_counters = _read_counters(sysfs, *base, "hw_counters")
    numa = _optional(sysfs, int, *base, "device", "numa_node")
    device = EfaDevice(
        name=name,
        pci_address=sysfs.link_target(*base, "device") or "",
        pci_device_id=sysfs.read_attr_or_none(*base, "device", "device") or "",
        numa_node=numa if numa is not None and numa >= 0 else None,
        node_guid=sysfs.read_attr_or_none(*base, "node_guid") or "",
        fw_version=sysfs.read_attr_or_none(*base, "fw_ver") or "",
        counters=device_counters,
        ports=ports,
    )
    if not sysfs.exists(*base):
        # hot-unplugged or driver unloaded mid-read: a half reading would look like counter resets
        logger.debug("EFA device %s vanished while being read", name)
        return None
    return device


def read_efa(sysfs: Root) -> EfaReading:
    """Every EFA device under ``class/infiniband`` (possibly none).

    A device whose directories cannot be listed is reported unreadable and the others are still read;
    ``class/infiniband`` itself unreadable raises :class:`~fleetscope.sources.fs.Unreadable`.
    """
    names = sysfs.listdir("class", "infiniband")
    devices: list[EfaDevice] = []
    unreadable: list[UnreadableDevice] = []
    for name in names:
        try:
            device = _read_device(sysfs, name)
        except Unreadable as exc:
            logger.debug("EFA device %s unreadable: %s", name, exc)
            unreadable.append(UnreadableDevice(name, str(exc)))
            continue
        if device is not None:
            devices.append(device)
    return EfaReading(tuple(devices), len(names), sysfs.exists("class", "infiniband"), tuple(unreadable))
