"""The kernel files a capture keeps: exactly what the readers read, where the kernel keeps it.

Nothing under ``/sys`` is read wholesale (some attributes block, some map device memory): a
:class:`TreeCopy` follows the readers' own paths through the kernel's links (``class/net/ens32`` ->
``devices/.../net/ens32``, its ``device`` link back up to the PCI function), keeping every link it passes
and every attribute at its real place, with the readers' bounded non-blocking read. An attribute the
kernel refused is kept as an empty directory of that name, so reading it in the replay fails the same
way; the reason goes to the manifest.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fleetscope.sources.fs import SYSFS_READ_LIMIT
from fleetscope.sources.netdev import select_interfaces

KMSG_READ_SIZE = 8192
KMSG_MAX_BYTES = 64 * 1024 * 1024  # a ring buffer is a few MiB; a regular file is read no further than this
# A multi-line "fallen off the bus" message may span this many records (the kmsg reader's window).
KMSG_WINDOW = 6
KMSG_HEADER_RE = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<text>.*)$", re.DOTALL)
NET_ATTRIBUTES = ("operstate", "carrier", "carrier_changes", "speed", "mtu", "address", "type")
NVIDIA_VENDOR = "0x10de"


@dataclass
class TreeCopy:
    """The part of one pseudo-filesystem a capture keeps: files, links, directories, refusals."""

    root: str
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> content
    links: dict[str, str] = field(default_factory=dict)  # relative path -> link text
    dirs: set[str] = field(default_factory=set)  # directories listed (kept even when empty)
    unreadable: dict[str, str] = field(default_factory=dict)  # relative path -> why the kernel refused it

    def _resolve(self, parts: Iterable[str], follow_last: bool = True, depth: int = 0) -> str | None:
        """The real relative path of ``parts``, keeping every link on the way; None if absent or outside."""
        current = ""
        parts = [p for part in parts for p in part.split("/") if p]
        for position, name in enumerate(parts):
            candidate = os.path.join(current, name) if current else name
            full = os.path.join(self.root, candidate)
            if os.path.islink(full):
                text = os.readlink(full)
                target = os.path.normpath(os.path.join(os.path.dirname(candidate), text))
                if os.path.isabs(text) or target == ".." or target.startswith("../") or depth > 16:
                    return None  # a link out of the mount: neither kept nor followed
                self.links[candidate] = text
                if position == len(parts) - 1 and not follow_last:
                    return candidate
                resolved = self._resolve(target.split("/"), True, depth + 1)
                if resolved is None:
                    return None
                current = resolved
            elif os.path.lexists(full):
                current = candidate
            else:
                return None
        return current

    def attribute(self, *parts: str) -> bytes | None:
        """Keep one sysfs attribute, read as the readers read it (one bounded non-blocking read)."""
        relative = self._resolve(parts)
        if relative is None:
            return None
        full = os.path.join(self.root, relative)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            self.unreadable[relative] = _reason(exc)
            return None
        try:
            data = os.read(fd, SYSFS_READ_LIMIT)
        except OSError as exc:
            self.unreadable[relative] = _reason(exc)
            return None
        finally:
            os.close(fd)
        self.files[relative] = data
        return data

    def whole_file(self, *parts: str, keep: Callable[[bytes], bytes] = lambda data: data) -> bytes | None:
        """Keep one procfs file, read whole (procfs sizes read as 0), at the path asked for: procfs links
        (``net`` -> ``self/net``) point into the reading process, which the replay is not."""
        relative = "/".join(parts)
        try:
            with open(os.path.join(self.root, relative), "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.unreadable[relative] = _reason(exc)
            return None
        self.files[relative] = keep(data)
        return data

    def listing(self, *parts: str) -> list[str]:
        relative = self._resolve(parts)
        if relative is None or not os.path.isdir(os.path.join(self.root, relative)):
            return []
        self.dirs.add(relative)
        try:
            return sorted(os.listdir(os.path.join(self.root, relative)))
        except OSError:
            return []

    def link(self, *parts: str) -> None:
        """Keep a link itself (a ``driver`` link: its target's name is what is read)."""
        self._resolve(parts, follow_last=False)

    def counters(self, *parts: str) -> None:
        """Every entry of a counter directory: files as attributes, anything else as refused."""
        for name in self.listing(*parts):
            relative = self._resolve((*parts, name))
            if relative is not None and os.path.isdir(os.path.join(self.root, relative)):
                self.unreadable[relative] = "EISDIR"
            else:
                self.attribute(*parts, name)


def _reason(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, exc.strerror or str(exc))


# -- what the readers read ------------------------------------------------------------------------


def copy_sysfs(root: str, net_include: str = "", net_exclude: str = "") -> TreeCopy:
    """RDMA devices (every one: the EFA reader tells EFA from others by vendor), the selected network
    interfaces, and NVIDIA functions on the PCI bus."""
    tree = TreeCopy(root)
    for name in tree.listing("class", "infiniband"):
        base = ("class", "infiniband", name)
        for attr in ("vendor", "device", "numa_node"):
            tree.attribute(*base, "device", attr)
        for attr in ("node_guid", "fw_ver"):
            tree.attribute(*base, attr)
        for port in tree.listing(*base, "ports"):
            if not port.isdigit():
                continue
            for attr in ("state", "phys_state", "rate", "link_layer"):
                tree.attribute(*base, "ports", port, attr)
            tree.counters(*base, "ports", port, "hw_counters")
        tree.counters(*base, "hw_counters")
    for name in select_interfaces(tree.listing("class", "net"), net_include, net_exclude):
        base = ("class", "net", name)
        tree.counters(*base, "statistics")
        for attr in NET_ATTRIBUTES:
            tree.attribute(*base, attr)
        if tree._resolve((*base, "device")) is not None:
            tree.link(*base, "device", "driver")
            for attr in ("vendor", "device"):
                tree.attribute(*base, "device", attr)
    for address in tree.listing("bus", "pci", "devices"):
        # only NVIDIA functions matter to the GPU count: nothing of the others is kept
        if _peek(os.path.join(root, "bus", "pci", "devices", address, "vendor")).strip().lower() == NVIDIA_VENDOR:
            for attr in ("vendor", "class", "device"):
                tree.attribute("bus", "pci", "devices", address, attr)
    return tree


def _peek(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        return os.read(fd, SYSFS_READ_LIMIT).decode("ascii", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def copy_procfs(root: str) -> TreeCopy:
    """The TCP counters, and of ``stat`` only the boot time (kernel-log stamps count from it)."""
    tree = TreeCopy(root)
    tree.whole_file("net", "snmp")
    tree.whole_file("net", "netstat")
    tree.whole_file("stat", keep=lambda data: b"".join(
        line + b"\n" for line in data.splitlines() if line.startswith(b"btime ")))
    return tree


@dataclass(frozen=True)
class KernelLog:
    records: tuple[str, ...]  # kept kmsg records, one line each (dictionary lines dropped)
    total: int  # records read
    error: str = ""


def read_kernel_log(path: str) -> KernelLog:
    """The driver's lines (``NVRM``) from ``/dev/kmsg`` or a file of its records.

    Other records are dropped, except that up to :data:`KMSG_WINDOW` of them after a driver line are kept
    as ``(not captured)`` placeholders: the kmsg reader gives a multi-line message that many records, so
    the replay must count the same records in between.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return KernelLog((), 0, f"{path}: {exc.strerror}")
    chunks: list[bytes] = []
    size = 0
    try:
        while size < KMSG_MAX_BYTES:
            try:
                chunk = os.read(fd, KMSG_READ_SIZE)
            except BlockingIOError:
                break  # the end of the ring buffer
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # overwritten before we read it
                return KernelLog((), 0, f"{path}: {exc.strerror}")
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    kept: list[str] = []
    total = 0
    since_driver = KMSG_WINDOW  # records since the last driver line
    for raw in b"".join(chunks).split(b"\n"):
        if not raw or raw.startswith(b" "):
            continue  # dictionary lines carry no message
        total += 1
        line = raw.decode("utf-8", "replace")
        header = KMSG_HEADER_RE.match(line)
        text = header.group("text") if header else line
        if "NVRM" in text:
            kept.append(line)
            since_driver = 0
        elif since_driver < KMSG_WINDOW:
            since_driver += 1
            kept.append(f"{header.group('prio')},{header.group('seq')},{header.group('usec')},-;(not captured)"
                        if header else "(not captured)")
    return KernelLog(tuple(kept), total)
