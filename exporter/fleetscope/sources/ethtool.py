"""ethtool driver statistics (``ethtool -S``) through the ``SIOCETHTOOL`` ioctl.

Why hand-written: the standard library has ``fcntl.ioctl`` and ``struct``, and
reading driver statistics takes three fixed-layout ioctls (count, names,
values). The one well-kept library that wraps them, pyroute2, is a large
dependency for this, and its ``get_statistics()`` sends ``n_stats=0`` with a
buffer sized from cached names, so a count that grows after a queue
reconfiguration can make an older kernel write past its buffer. Here every
request carries the count it expects, buffers have headroom, and a mismatch
is retried a bounded number of times.

Layouts (include/uapi/linux/ethtool.h, all native-endian):

* ``ethtool_drvinfo``: u32 cmd; char driver[32], version[32], fw_version[32],
  bus_info[32], erom_version[32], reserved2[12]; u32 n_priv_flags, n_stats,
  testinfo_len, eedump_len, regdump_len  (196 bytes)
* ``ethtool_sset_info``: u32 cmd, reserved; u64 sset_mask; u32 data[]
* ``ethtool_gstrings``: u32 cmd, string_set, len; u8 data[len * 32]
* ``ethtool_stats``: u32 cmd, n_stats; u64 data[n_stats]

The device is looked up by name in the caller's network namespace, so the
daemon must run in the host namespace (hostNetwork) to see the node's NICs.
None of these commands needs CAP_NET_ADMIN.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import re
import socket
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from fleetscope.sources.fs import Root

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x03
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
IFREQ_SIZE = 40  # sizeof(struct ifreq) on LP64: 16-byte name + 24-byte union

DRVINFO_FORMAT = "=I32s32s32s32s32s12sIIIII"
DRVINFO_SIZE = struct.calcsize(DRVINFO_FORMAT)
SSET_INFO_HEADER = "=IIQ"
GSTRINGS_HEADER = "=III"
STATS_HEADER = "=II"

# Attempts at a consistent (count, names, values) triple before giving up on an
# interface: a count only changes on queue reconfiguration, so two changes in a
# row are already rare.
DEFAULT_ATTEMPTS = 4


def buffer_capacity(count: int) -> int:
    """Entries to allocate for ``count`` expected entries.

    Kernels before "ethtool: Avoid overflowing userspace buffer on stats query"
    (upstream 7b07be1ff1cb, Dec 2025) ignore the count we send and write their
    own; the headroom absorbs a count that grew between two ioctls, and the
    returned count is then seen to differ and the pass is retried.
    """
    return 2 * count + 64


class EthtoolIoctl(Protocol):
    """Runs one ``SIOCETHTOOL`` request for ``device``; the kernel reads and writes ``request`` in place.

    Raises :class:`OSError` with the kernel's errno on failure.
    """

    def __call__(self, device: str, request: bytearray) -> None: ...


class EthtoolError(Exception):
    """An interface's statistics could not be read consistently."""

    def __init__(self, device: str, reason: str, errno_value: int | None = None) -> None:
        super().__init__(f"{device}: {reason}")
        self.device = device
        self.reason = reason
        self.errno = errno_value


class CountChanged(Exception):
    """The kernel answered with a different count than the request carried."""


@dataclass(frozen=True)
class DriverInfo:
    driver: str
    version: str
    firmware_version: str
    bus_info: str
    n_stats: int


@dataclass(frozen=True)
class InterfaceStats:
    """One interface's driver statistics, names and values from the same pass."""

    device: str
    driver: str
    stats: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def get(self, name: str) -> int | None:
        return self.stats.get(name)


@dataclass(frozen=True)
class UnreadableInterface:
    """An interface of the wanted driver whose statistics could not be read (it is skipped)."""

    device: str
    driver: str
    reason: str


@dataclass(frozen=True)
class EthtoolReading:
    interfaces: tuple[InterfaceStats, ...]
    unreadable: tuple[UnreadableInterface, ...]

    @property
    def found(self) -> int:
        """Interfaces of the wanted driver seen, readable or not."""
        return len(self.interfaces) + len(self.unreadable)


# -- the real ioctl --------------------------------------------------------------------------------


class SocketIoctl:
    """:class:`EthtoolIoctl` on a datagram socket in the caller's network namespace."""

    def __init__(self) -> None:
        try:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        except OSError:
            # An IPv4-less kernel still routes device ioctls from any socket family.
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def __call__(self, device: str, request: bytearray) -> None:
        name = device.encode()
        if not name or len(name) >= IFNAMSIZ:
            raise OSError(errno.ENODEV, f"invalid interface name {device!r}")
        # ifr_data points straight at ``request``: the kernel copies the command in
        # and its answer back through that pointer, so ``request`` must stay put
        # (the ctypes view pins the bytearray against resizing for the call).
        view = (ctypes.c_char * len(request)).from_buffer(request)
        try:
            ifreq = struct.pack("16sP", name, ctypes.addressof(view)).ljust(IFREQ_SIZE, b"\0")
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, ifreq)
        finally:
            del view

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> SocketIoctl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the three (four) requests ---------------------------------------------------------------------


def _c_string(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def driver_info(ioctl: EthtoolIoctl, device: str) -> DriverInfo:
    request = bytearray(DRVINFO_SIZE)
    struct.pack_into("=I", request, 0, ETHTOOL_GDRVINFO)
    ioctl(device, request)
    fields = struct.unpack_from(DRVINFO_FORMAT, request)
    return DriverInfo(
        driver=_c_string(fields[1]),
        version=_c_string(fields[2]),
        firmware_version=_c_string(fields[3]),
        bus_info=_c_string(fields[4]),
        n_stats=fields[8],
    )


def stats_count(ioctl: EthtoolIoctl, device: str) -> int:
    """Number of statistics (GSSET_INFO; GDRVINFO's n_stats for drivers without it)."""
    request = bytearray(struct.calcsize(SSET_INFO_HEADER) + 4)
    struct.pack_into(SSET_INFO_HEADER, request, 0, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS)
    try:
        ioctl(device, request)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        return driver_info(ioctl, device).n_stats
    _, _, mask = struct.unpack_from(SSET_INFO_HEADER, request)
    if not mask & (1 << ETH_SS_STATS):
        return 0  # the driver has no statistics string set
    count: int = struct.unpack_from("=I", request, struct.calcsize(SSET_INFO_HEADER))[0]
    return count


def stats_names(ioctl: EthtoolIoctl, device: str, count: int) -> tuple[str, ...]:
    header = struct.calcsize(GSTRINGS_HEADER)
    capacity = buffer_capacity(count)
    request = bytearray(header + capacity * ETH_GSTRING_LEN)
    struct.pack_into(GSTRINGS_HEADER, request, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
    ioctl(device, request)
    _, _, returned = struct.unpack_from(GSTRINGS_HEADER, request)
    if returned != count:
        # Newer kernels answer 0 on a mismatch, older ones their own count.
        raise CountChanged(f"asked for {count} names, kernel has {returned}")
    raw = bytes(request[header: header + count * ETH_GSTRING_LEN])
    return tuple(_c_string(raw[i * ETH_GSTRING_LEN: (i + 1) * ETH_GSTRING_LEN]) for i in range(count))


def stats_values(ioctl: EthtoolIoctl, device: str, count: int) -> tuple[int, ...]:
    header = struct.calcsize(STATS_HEADER)
    capacity = buffer_capacity(count)
    request = bytearray(header + capacity * 8)
    struct.pack_into(STATS_HEADER, request, 0, ETHTOOL_GSTATS, count)
    ioctl(device, request)
    _, returned = struct.unpack_from(STATS_HEADER, request)
    if returned != count:
        raise CountChanged(f"asked for {count} values, kernel has {returned}")
    return struct.unpack_from(f"={count}Q", request, header)


def read_stats(ioctl: EthtoolIoctl, device: str, attempts: int = DEFAULT_ATTEMPTS) -> dict[str, int]:
    """Statistic name -> value, names and values from one consistent pass.

    Raises :class:`EthtoolError` when the device refuses (errno kept) or its
    count keeps changing for ``attempts`` passes.
    """
    last = ""
    for _ in range(max(1, attempts)):
        try:
            count = stats_count(ioctl, device)
            if count == 0:
                return {}
            names = stats_names(ioctl, device, count)
            values = stats_values(ioctl, device, count)
        except CountChanged as exc:
            last = str(exc)
            continue
        except OSError as exc:
            raise EthtoolError(device, exc.strerror or str(exc), exc.errno) from None
        stats: dict[str, int] = {}
        for name, value in zip(names, values, strict=True):
            stats.setdefault(name, value)  # a repeated name keeps its first value
        return stats
    raise EthtoolError(device, f"statistics count kept changing ({last})")


# -- interfaces of one driver ----------------------------------------------------------------------


def _selected(device: str, include: str, exclude: str) -> bool:
    if include and not re.search(include, device):
        return False
    return not (exclude and re.search(exclude, device))


def interface_driver(root: Root, ioctl: EthtoolIoctl, device: str) -> str | None:
    """The driver bound to ``device``: the sysfs device/driver link, else GDRVINFO (virtual devices)."""
    linked = root.link_target("class", "net", device, "device", "driver")
    if linked:
        return linked
    try:
        return driver_info(ioctl, device).driver or None
    except OSError:
        return None


def read_interfaces(
    root: Root,
    ioctl: EthtoolIoctl,
    drivers: Iterable[str],
    include: str = "",
    exclude: str = "",
    attempts: int = DEFAULT_ATTEMPTS,
) -> EthtoolReading:
    """Statistics of every interface under ``root``'s ``class/net`` bound to one of ``drivers``.

    An interface that vanishes mid-read is dropped; one that refuses (e.g.
    EPERM) or never gives a consistent count is listed as unreadable. Neither
    stops the others from being read.
    """
    wanted = frozenset(drivers)
    readable: list[InterfaceStats] = []
    unreadable: list[UnreadableInterface] = []
    for device in root.listdir("class", "net"):
        if not _selected(device, include, exclude):
            continue
        driver = interface_driver(root, ioctl, device)
        if driver not in wanted:
            continue
        try:
            stats = read_stats(ioctl, device, attempts)
        except EthtoolError as exc:
            if exc.errno == errno.ENODEV:
                continue  # gone between the listing and the ioctl
            unreadable.append(UnreadableInterface(device, driver, exc.reason))
            continue
        readable.append(InterfaceStats(device, driver, MappingProxyType(stats)))
    return EthtoolReading(tuple(readable), tuple(unreadable))


def read_with_socket(
    root: Root,
    drivers: Iterable[str],
    include: str = "",
    exclude: str = "",
    ioctl_factory: Callable[[], SocketIoctl] = SocketIoctl,
) -> EthtoolReading:
    """:func:`read_interfaces` over a socket opened for this one reading."""
    with ioctl_factory() as ioctl:
        return read_interfaces(root, ioctl, drivers, include, exclude)
