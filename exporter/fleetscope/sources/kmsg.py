"""Xid errors from the kernel log (``/dev/kmsg``, or a file of its records).

``/dev/kmsg`` hands out one record per ``read()``: ``prio,seq,usec,flags;text``
followed by optional dictionary lines that start with a space; non-printable
bytes (newlines inside one message) are escaped as ``\\xNN``. Opening it
starts at the oldest record still in the ring buffer, so Xids logged before
the daemon started are seen once; later polls read only what is new. Reads are
non-blocking: EAGAIN means "nothing new", EPIPE means records were overwritten
before we read them (skip and go on).

Formats recognised (``../shared/reference/gpu.md`` §3.4)::

    NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:53:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception ...
    NVRM: Xid (PCI:0000:53:00): 31, pid=11461, Ch 00000053, intr 10000000. MMU Fault: ...   (no name=)
    NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000005 intr 00008000                        (no pid=)
    NVRM: Xid (0000:01:00): 13, ...                                                         (no PCI: prefix)
    NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 ...)  (NVLink5)
    NVRM: Xid (PCI:0000:53:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
    NVRM: The NVIDIA GPU 0000:b3:00.0 / NVRM: (PCI ID: 10de:26b5) installed in this system has /
    NVRM: fallen off the bus and is not responding to commands.                              (no Xid: counts as 79)
    NVRM: GPU at PCI:0000:53:00: GPU-<uuid>                                                 (PCI -> UUID)
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from dataclasses import dataclass, field

from fleetscope.errors import SourceError
from fleetscope.sources.fs import Root, Unreadable
from fleetscope.sources.xid import PciAddress

logger = logging.getLogger(__name__)

_PCI = r"[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?"
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>" + _PCI + r")\): (?P<xid>\d+)(?P<rest>.*)", re.DOTALL)
PID_RE = re.compile(r"^,\s*pid=(?P<pid>'<unknown>'|<unknown>|\d+)")
NAME_RE = re.compile(r"^,\s*name=(?P<name>[^,]*)")
NVLINK5_RE = re.compile(r"(?P<unit>\w+)\s+(?P<severity>\w+)\s+(?P<xc>\w+)\s+(?P<inst>\w+)\s+Link\s+(?P<link>-?\d+)")
RECOVERY_RE = re.compile(r"recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) to (?P<code>0x[0-9a-fA-F]+)")
GPU_AT_RE = re.compile(r"NVRM: GPU at PCI:(?P<pci>" + _PCI + r"): (?P<uuid>GPU-[0-9a-fA-F-]+)")
FALLEN_START_RE = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>" + _PCI + r")")
FALLEN_RE = re.compile(r"fallen off the bus and is not responding to commands")
HEADER_RE = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<text>.*)$", re.DOTALL)
ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")

# A multi-line "fallen off the bus" message is complete within this many records, or it is not that message.
FALLEN_MAX_RECORDS = 6
READ_SIZE = 8192
FALLEN_OFF_XID = 79


@dataclass(frozen=True)
class KmsgXid:
    pci: PciAddress
    xid: int
    timestamp: float  # Unix seconds (boot time + the record's monotonic stamp)
    pid: int | None = None
    process: str = ""
    message: str = ""
    nvlink_severity: str = ""  # NVLink5 sub-code: "Fatal" / "Nonfatal"
    nvlink_link: int | None = None
    recovery_action: int | None = None  # Xid 154: the driver's new recovery action
    multiline: bool = False  # from the "fallen off the bus" message that carries no Xid number


@dataclass(frozen=True)
class KmsgBatch:
    xids: tuple[KmsgXid, ...] = ()
    uuids: dict[PciAddress, str] = field(default_factory=dict)


def parse_xid_text(text: str, timestamp: float) -> KmsgXid | None:
    """Parse one ``NVRM: Xid`` message (any variant); None if the text is not one."""
    match = XID_RE.search(text)
    if match is None:
        return None
    rest = match.group("rest")
    pid: int | None = None
    process = ""
    pid_match = PID_RE.match(rest)
    if pid_match:
        raw_pid = pid_match.group("pid")
        pid = int(raw_pid) if raw_pid.isdigit() else None
        rest = rest[pid_match.end():]
        name_match = NAME_RE.match(rest)
        if name_match:
            process = name_match.group("name").strip()
            process = "" if process == "<unknown>" else process
            rest = rest[name_match.end():]
    message = rest.lstrip(", ").strip()
    xid = int(match.group("xid"))
    severity, link = "", None
    nvlink = NVLINK5_RE.match(message) if 144 <= xid <= 150 else None
    if nvlink:
        severity, link = nvlink.group("severity"), int(nvlink.group("link"))
    recovery = RECOVERY_RE.search(message) if xid == 154 else None
    return KmsgXid(
        pci=PciAddress.parse(match.group("pci")), xid=xid, timestamp=timestamp, pid=pid, process=process,
        message=message, nvlink_severity=severity, nvlink_link=link,
        recovery_action=int(recovery.group("code"), 16) if recovery else None,
    )


def boot_time(procfs: Root) -> float:
    """Unix time of boot (``btime`` in /proc/stat); kmsg stamps count from it."""
    try:
        for line in procfs.read_file("stat").splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (Unreadable, ValueError, IndexError):
        pass
    return time.time() - time.monotonic()


class KmsgReader:
    """Incremental, non-blocking reader of kernel-log records; one per collector."""

    def __init__(self, path: str, boot: float) -> None:
        self.path = path
        self.boot = boot
        self._fd: int | None = None
        self._pending = b""  # an incomplete last line of a regular file
        self._fallen: tuple[PciAddress, float, str, int] | None = None  # (gpu, stamp, text so far, records seen)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                raise SourceError(f"{self.path}: {exc.strerror}") from None
        return self._fd

    def _read_records(self) -> list[bytes]:
        fd = self._open()
        records: list[bytes] = []
        data = self._pending
        while True:
            try:
                chunk = os.read(fd, READ_SIZE)
            except BlockingIOError:
                break  # EAGAIN: nothing new in the ring buffer
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten before we read them: skip to the next
                raise SourceError(f"{self.path}: {exc.strerror}") from None
            if not chunk:
                break  # end of a regular file
            data += chunk
        *complete, self._pending = data.split(b"\n")
        records.extend(complete)
        return records

    def poll(self) -> KmsgBatch:
        """Everything new since the last poll (the whole ring buffer on the first)."""
        xids: list[KmsgXid] = []
        uuids: dict[PciAddress, str] = {}
        for raw in self._read_records():
            if not raw or raw.startswith(b" "):
                continue  # dictionary lines (" SUBSYSTEM=pci") carry no message
            line = raw.decode("utf-8", "replace")
            header = HEADER_RE.match(line)
            if header:
                stamp = self.boot + int(header.group("usec")) / 1e6
                text = ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), header.group("text"))
            else:
                stamp, text = time.time(), line  # a plain text line (a dmesg dump)
            self._scan(text, stamp, xids, uuids)
        return KmsgBatch(tuple(xids), uuids)

    def _scan(self, text: str, stamp: float, xids: list[KmsgXid], uuids: dict[PciAddress, str]) -> None:
        if "NVRM" not in text and self._fallen is None:
            return
        try:
            xid = parse_xid_text(text, stamp)
            if xid is not None:
                xids.append(xid)
                return
            announce = GPU_AT_RE.search(text)
            if announce:
                uuids[PciAddress.parse(announce.group("pci"))] = announce.group("uuid")
                return
            start = FALLEN_START_RE.search(text)
            if start:
                self._fallen = (PciAddress.parse(start.group("pci")), stamp, "", 0)
            if self._fallen is not None:
                pci, first_stamp, so_far, seen = self._fallen
                so_far += "\n" + text
                if FALLEN_RE.search(so_far):
                    xids.append(KmsgXid(pci, FALLEN_OFF_XID, first_stamp, message="GPU has fallen off the bus",
                                        multiline=True))
                    self._fallen = None
                elif seen + 1 >= FALLEN_MAX_RECORDS:
                    self._fallen = None
                else:
                    self._fallen = (pci, first_stamp, so_far, seen + 1)
        except ValueError as exc:  # a malformed address: skip the record, never the reader
            logger.debug("kmsg: skipped record %r: %s", text[:120], exc)
