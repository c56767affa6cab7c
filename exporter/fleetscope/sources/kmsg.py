"""Xid errors from the kernel log (``/dev/kmsg``, or a file of its records).

``/dev/kmsg`` hands out one record per ``read()``: ``prio,seq,usec,flags;text``
followed by optional dictionary lines that start with a space; non-printable
bytes (newlines inside one message) are escaped as ``\\xNN``. Opening it
starts at the oldest record still in the ring buffer, so Xids logged before
the daemon started are seen once; later polls read only what is new. Reads are
non-blocking: EAGAIN means "nothing new", EPIPE means records were overwritten
before we read them (skip and go on).

Only the driver speaks for the driver. A record counts when it comes from the
kernel's own facility (0: a process writing to ``/dev/kmsg`` is given another)
and its message *starts* with ``NVRM:``; anywhere else the text is someone
else's words about it. The kernel quotes user-chosen text mid-message (a
segfault report names the crashing binary, whose name can be
``x NVRM: Xid (...): 79, ...``), so an unanchored pattern lets any local user
forge an Xid. A plain text line (a dmesg or journal dump) may carry its
``[  12.345]`` stamp or ``... kernel:`` prefix before ``NVRM:``, nothing else.

Each poll reads for at most ``budget`` seconds and keeps its place, so a full
ring buffer (100k records) never holds ``fleetscope check`` past its deadline;
records without ``NVRM`` are skipped before they are decoded.

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
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetscope.errors import SourceError
from fleetscope.sources.fs import Root, Unreadable
from fleetscope.sources.xid import PciAddress

logger = logging.getLogger(__name__)

_PCI = r"[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?"
# What may stand before the driver's "NVRM:" on a plain text line: a dmesg stamp, a syslog/journal prefix.
LINE_PREFIX_RE = re.compile(
    r"(?:\[\s*\d+(?:\.\d+)?\]\s*)?(?:(?:[A-Z][a-z]{2}\s+\d+\s+[\d:]+\s+\S+\s+)?kernel:\s*(?:\[\s*\d+(?:\.\d+)?\]\s*)?)?"
    r"(?=NVRM:)"
)
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
POLL_BUDGET = 1.0  # seconds one poll may spend reading; the rest waits for the next poll
SCAN_BATCH = 1024  # records scanned between looks at the clock
KERNEL_FACILITY = 0  # syslog facility of the kernel's own records (prio >> 3)
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


def driver_text(text: str) -> str | None:
    """The message from its ``NVRM:`` on, when it starts with the driver's prefix (after a line's stamp); else None."""
    if text.startswith("NVRM:"):
        return text
    prefix = LINE_PREFIX_RE.match(text)
    return text[prefix.end():] if prefix is not None else None


def parse_xid_text(text: str, timestamp: float) -> KmsgXid | None:
    """Parse one ``NVRM: Xid`` message (any variant); None if the text is not one or is not the driver's."""
    own = driver_text(text)
    match = XID_RE.match(own) if own is not None else None
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

    def __init__(self, path: str, boot: float, budget: float = POLL_BUDGET,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.boot = boot
        self.budget = budget
        self._clock = clock
        self.behind = False  # the last poll stopped at its budget with records left unread
        self._backlog: list[bytes] = []  # records read and not scanned yet
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

    def _read_records(self, deadline: float) -> list[bytes]:
        """Whole records read before ``deadline`` (an incomplete last line of a file waits for its end)."""
        fd = self._open()
        chunks = [self._pending]
        while True:
            if self._clock() > deadline:
                self.behind = True  # the rest of the ring buffer waits for the next poll
                break
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
            chunks.append(chunk)  # joined once: appending to one bytes object is quadratic
        *complete, self._pending = b"".join(chunks).split(b"\n")
        return complete

    def poll(self) -> KmsgBatch:
        """What is new since the last poll (the whole ring buffer on the first), as far as ``budget`` allows:
        ``behind`` says records were left for the next poll."""
        xids: list[KmsgXid] = []
        uuids: dict[PciAddress, str] = {}
        deadline = self._clock() + self.budget
        self.behind = False
        records = self._backlog + self._read_records(deadline)
        self._backlog = []
        for index, raw in enumerate(records):
            if index % SCAN_BATCH == SCAN_BATCH - 1 and self._clock() > deadline:
                self._backlog, self.behind = records[index:], True
                break
            if not raw or raw.startswith(b" "):
                continue  # dictionary lines (" SUBSYSTEM=pci") carry no message
            if b"NVRM" not in raw and self._fallen is None:
                continue  # most of a ring buffer: not the driver's, not worth decoding
            line = raw.decode("utf-8", "replace")
            header = HEADER_RE.match(line)
            if header:
                if int(header.group("prio")) >> 3 != KERNEL_FACILITY:
                    continue  # written to /dev/kmsg by a process, not logged by the kernel
                stamp = self.boot + int(header.group("usec")) / 1e6
                text = ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), header.group("text"))
            else:
                stamp, text = time.time(), line  # a plain text line (a dmesg dump)
            self._scan(text, stamp, xids, uuids)
        return KmsgBatch(tuple(xids), uuids)

    def _scan(self, text: str, stamp: float, xids: list[KmsgXid], uuids: dict[PciAddress, str]) -> None:
        own = driver_text(text)
        if own is None and self._fallen is None:
            return
        try:
            xid = parse_xid_text(text, stamp)
            if xid is not None:
                xids.append(xid)
                return
            announce = GPU_AT_RE.match(own) if own is not None else None
            if announce:
                uuids[PciAddress.parse(announce.group("pci"))] = announce.group("uuid")
                return
            start = FALLEN_START_RE.match(own) if own is not None else None
            if start:
                self._fallen = (PciAddress.parse(start.group("pci")), stamp, "", 0)
            if self._fallen is not None:
                pci, first_stamp, so_far, seen = self._fallen
                if own is not None:  # another's record in between counts towards the window, not the text
                    so_far += "\n" + own
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
