"""NCCL Inspector output: the JSON-lines files of NVIDIA's Inspector profiler plugin, read as they grow.

The plugin (``NVIDIA/nccl``, ``plugins/profiler/inspector``, before 2.29.7
``ext-profiler/inspector``; loaded with ``NCCL_PROFILER_PLUGIN`` and enabled
with ``NCCL_INSPECTOR_ENABLE=1``) gives each process one file in
``NCCL_INSPECTOR_DUMP_DIR``, ``<hostname>-pid<pid>.log``, opened once with
``fopen(..., "w")`` and appended to by a dump thread every
``NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS``. Every line is one compact
JSON object, one completed operation of one communicator::

    {"header":{"id":"0x7f8c496ae9f661","comm_name":"DP Group 0","rank":2,"n_ranks":8,"nnodes":1},
     "metadata":{"inspector_output_format_version":"v4.0","git_rev":"","rec_mechanism":
     "nccl_profiler_interface","dump_timestamp_us":1748030377748202,"hostname":"node-a","pid":1639453},
     "coll_perf":{"coll":"AllReduce","coll_sn":1407,"coll_msg_size_bytes":17179869184,
     "coll_exec_time_us":61974,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":277.210914,
     "coll_busbw_gbs":485.119099}}

Shapes shipped (all say ``"v4.0"``; docs/nccl-inspector.md has every field):

* NCCL 2.28.3 to 2.29.7: header without ``comm_name``; only ``coll_perf``
  records, one per communicator per dump (the latest completed collective:
  a sample, not every collective).
* NCCL 2.30 on: header with ``comm_name``; every completed collective (a
  1024-entry ring per communicator between dumps) and ``p2p_perf`` records
  for Send/Recv (``p2p``, ``p2p_peer``, ``p2p_*`` fields).
* With ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` a record also carries
  ``event_trace_sn`` / ``event_trace_ts``; those and any unknown key are ignored.

Reading never blocks on the writer: a last line without its newline is left
for the next poll, and each poll reads at most a byte budget, so a backlog is
worked off over several polls with bounded memory. Files are followed by
inode through an open descriptor: a rename-and-create rotation keeps the old
inode readable (the plugin never reopens its file and goes on writing to the
renamed one), a truncation (``copytruncate``) restarts from the beginning, a
file idle for the time-to-live is closed. The plugin's Prometheus textfile mode
(``NCCL_INSPECTOR_PROM_DUMP=1``, ``nccl_inspector_metrics_<uuid>.prom``) carries
no rank, communicator id or count, so it is only reported, never read.

This module knows no metric names: it yields typed records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetscope.sources.fs import Root, Unreadable
from fleetscope.sources.gpu_jobs import JobAttribution, attribute_process

logger = logging.getLogger("fleetscope.sources.nccl")

# The plugin's name, and the same with a logrotate suffix: after a rename rotation the plugin goes on
# writing to the renamed file (it never reopens), so a daemon started later must still find it.
FILE_RE = re.compile(r"^(?P<host>.+)-pid(?P<pid>\d+)\.log(?:\.\d+)?$")
PROM_FILE_RE = re.compile(r"^nccl_inspector_metrics_.+\.prom$")
READ_CHUNK = 1 << 20
MAX_LINE_BYTES = 1 << 20  # a verbose record with 64 channels is ~15 KB; a longer "line" is not a record
REMEMBERED_FILES = 4096  # where reading stopped in files dropped as idle, in case they grow again

RecordKind = Literal["collective", "p2p"]
# Why a line was skipped; each reason is counted.
SKIP_REASONS = ("json", "fields", "too_long", "unknown_kind")


class MalformedRecord(ValueError):
    """A line that is not an Inspector record; ``reason`` is one of :data:`SKIP_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class InspectorRecord:
    """One completed collective or point-to-point operation of one communicator, as the plugin logged it."""

    kind: RecordKind
    comm: str  # header.id: the communicator's hash, the same on every rank of it
    comm_rank: int  # header.rank: the rank within the communicator
    comm_ranks: int  # header.n_ranks
    operation: str  # AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllGatherV, All2All; Send, Recv
    message_bytes: int
    seconds: float  # execution time (the plugin's microseconds, in seconds)
    comm_name: str = ""  # header.comm_name (2.30 on; the plugin writes "unknown" for an unnamed communicator)
    comm_nodes: int | None = None  # header.nnodes
    sequence: int | None = None  # coll_sn (NCCL's per-communicator collective count) or p2p_sn
    bus_bandwidth: float | None = None  # bytes per second (the plugin's GB/s, 1e9 bytes)
    algo_bandwidth: float | None = None
    timing_source: str = ""  # kernel_gpu, kernel_cpu, collective_cpu (absent before the field existed)
    peer: int | None = None  # p2p_peer
    format_version: str = ""  # metadata.inspector_output_format_version
    hostname: str = ""
    pid: int | None = None
    dump_timestamp: float | None = None  # Unix seconds


def _obj(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        raise MalformedRecord("fields", f"{key} is not an object")
    return value


def _int(section: Mapping[str, Any], key: str, required: bool = True) -> int | None:
    value = section.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if value is None and not required:
        return None
    raise MalformedRecord("fields", f"{key} is not an integer: {value!r}")


def _number(section: Mapping[str, Any], key: str) -> float | None:
    """A double the plugin printed with %lf; it writes NaN as the string "nan"."""
    value = section.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _str(section: Mapping[str, Any], key: str, required: bool = True) -> str:
    value = section.get(key)
    if isinstance(value, str):
        return value
    if value is None and not required:
        return ""
    raise MalformedRecord("fields", f"{key} is not a string: {value!r}")


def parse_record(line: str | bytes) -> InspectorRecord:
    """One output line as a record; raises :class:`MalformedRecord` for anything else."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRecord("json", str(exc)) from None
    if not isinstance(data, dict):
        raise MalformedRecord("json", "not an object")
    if "coll_perf" in data:
        kind: RecordKind = "collective"
        perf, prefix, op_key = _obj(data, "coll_perf"), "coll", "coll"
    elif "p2p_perf" in data:
        kind, prefix, op_key = "p2p", "p2p", "p2p"
        perf = _obj(data, "p2p_perf")
    else:
        raise MalformedRecord("unknown_kind", f"keys {sorted(data)[:6]}")
    header = _obj(data, "header")
    raw_metadata = data.get("metadata")
    metadata: Mapping[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    comm_rank, comm_ranks = _int(header, "rank"), _int(header, "n_ranks")
    assert comm_rank is not None and comm_ranks is not None
    if not 0 <= comm_rank < comm_ranks:
        raise MalformedRecord("fields", f"rank {comm_rank} outside 0..{comm_ranks - 1}")
    exec_us = _number(perf, f"{prefix}_exec_time_us")
    size = _int(perf, f"{prefix}_msg_size_bytes")
    assert size is not None
    if exec_us is None or exec_us < 0 or size < 0:
        raise MalformedRecord("fields", f"execution time {exec_us!r} or size {size!r} not usable")
    comm = _str(header, "id")
    if not comm:
        raise MalformedRecord("fields", "empty communicator id")
    operation = _str(perf, op_key)
    if not operation:
        raise MalformedRecord("fields", "empty operation")
    bus = _number(perf, f"{prefix}_busbw_gbs")
    algo = _number(perf, f"{prefix}_algobw_gbs")
    stamp = metadata.get("dump_timestamp_us")
    pid = metadata.get("pid")
    return InspectorRecord(
        kind=kind,
        comm=comm,
        comm_rank=comm_rank,
        comm_ranks=comm_ranks,
        operation=operation,
        message_bytes=size,
        seconds=exec_us * 1e-6,
        comm_name=_str(header, "comm_name", required=False),
        comm_nodes=_int(header, "nnodes", required=False),
        sequence=_int(perf, f"{prefix}_sn", required=False),
        bus_bandwidth=None if bus is None else bus * 1e9,
        algo_bandwidth=None if algo is None else algo * 1e9,
        timing_source=_str(perf, f"{prefix}_timing_source", required=False),
        peer=_int(perf, "p2p_peer", required=False) if kind == "p2p" else None,
        format_version=str(metadata.get("inspector_output_format_version") or ""),
        hostname=str(metadata.get("hostname") or ""),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        dump_timestamp=stamp / 1e6 if isinstance(stamp, int) and not isinstance(stamp, bool) else None,
    )


# -- which process wrote a file ----------------------------------------------------------------------


@dataclass(frozen=True)
class InspectorFile:
    """One writer's output file: the plugin names it after its host and pid (as the writer sees them)."""

    path: str
    hostname: str
    pid: int


def parse_ns_pids(status: str) -> tuple[int, ...]:
    """``NSpid:`` of ``/proc/<pid>/status``: the pid in each nested pid namespace, host's first."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            try:
                return tuple(int(p) for p in line.split()[1:])
            except ValueError:
                return ()
    return ()


def _environ_values(procfs: Root, pid: int, keys: tuple[str, ...]) -> dict[str, str]:
    try:
        data = procfs.read_file(str(pid), "environ")
    except Unreadable:
        return {}
    out: dict[str, str] = {}
    for item in data.split("\0"):
        key, sep, value = item.partition("=")
        if sep and key in keys:
            out[key] = value
    return out


def writer_pid(procfs: Root, file: InspectorFile) -> int | None:
    """The host pid of the process that writes ``file``, or None if it cannot be told.

    The pid in the name is the writer's own: inside a container (a Kubernetes
    pod) that is its pid namespace's number, not the host's. Every process
    whose innermost ``NSpid`` equals it is a candidate; several candidates
    (many containers have a pid 17) are told apart by the hostname the plugin
    put in the name, which a pod's ``HOSTNAME`` variable carries, and then by
    ``NCCL_INSPECTOR_ENABLE=1``.
    """
    candidates: list[int] = []
    for entry in procfs.listdir():
        if not entry.isdigit():
            continue
        try:
            ns_pids = parse_ns_pids(procfs.read_file(entry, "status"))
        except Unreadable:
            continue  # exited meanwhile
        if ns_pids and ns_pids[-1] == file.pid:
            candidates.append(int(entry))
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    environs = {pid: _environ_values(procfs, pid, ("HOSTNAME", "NCCL_INSPECTOR_ENABLE")) for pid in candidates}
    tests: tuple[Callable[[dict[str, str]], bool], ...] = (
        lambda env: env.get("HOSTNAME") == file.hostname,
        lambda env: env.get("NCCL_INSPECTOR_ENABLE") == "1",
    )
    for test in tests:
        narrowed = [pid for pid in candidates if test(environs[pid])]
        if len(narrowed) == 1:
            return narrowed[0]
        if narrowed:
            candidates = narrowed
            environs = {pid: environs[pid] for pid in narrowed}
    return None


def attribute_writer(procfs: Root, file: InspectorFile) -> JobAttribution | None:
    """The writer's training job and rank, by the GPU collector's rules (Slurm, Kubernetes, environment)."""
    pid = writer_pid(procfs, file)
    return None if pid is None else attribute_process(procfs, pid)


def _at_line_start(fd: int, offset: int) -> bool:
    if offset == 0:
        return True
    try:
        return os.pread(fd, 1, offset - 1) == b"\n"
    except OSError:
        return False


# -- following the files -----------------------------------------------------------------------------


@dataclass
class _Tail:
    file: InspectorFile
    fd: int
    inode: tuple[int, int]
    offset: int  # bytes consumed: always just after a newline (or a resync point)
    size: int = 0
    last_growth: float = 0.0
    resync: bool = False  # started mid-file: drop the partial first line


@dataclass
class ReaderStats:
    """What the last poll saw; counters are cumulative for the reader's life."""

    files: int = 0
    unread_bytes: int = 0
    records: dict[RecordKind, int] = field(default_factory=lambda: {"collective": 0, "p2p": 0})
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))
    prometheus_files: tuple[str, ...] = ()
    truncations: int = 0
    files_over_limit: int = 0


class InspectorReader:
    """Follows every ``<host>-pid<pid>.log`` in a directory and its direct subdirectories (one per job).

    :meth:`poll` yields ``(file, record)`` for everything completed since the
    last poll, reading at most ``max_read_bytes`` in all; :attr:`stats` is
    updated as it goes. A file whose last change is older than ``ttl`` is not
    picked up, and a followed file that has not grown for ``ttl`` is dropped
    (:meth:`expired` lists those since the last call).
    """

    def __init__(
        self, directory: str, max_read_bytes: int, ttl: float, max_files: int = 256,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.max_read_bytes = max(max_read_bytes, 4096)
        self.ttl = ttl
        self.max_files = max_files
        self.clock = clock
        self.stats = ReaderStats()
        self._tails: dict[tuple[int, int], _Tail] = {}
        self._expired: list[InspectorFile] = []
        # inode -> (host, pid, offset) of files dropped as idle: a rotated name keeps host and pid
        self._dropped_at: dict[tuple[int, int], tuple[str, int, int]] = {}
        self._turn = 0  # rotates which file reads first, so a busy file cannot starve the others

    # -- discovery ---------------------------------------------------------------------------------

    def exists(self) -> bool:
        return os.path.isdir(self.directory)

    def _candidates(self) -> Iterator[tuple[str, str]]:
        """(path, name) of every regular file in the directory and its direct subdirectories."""
        try:
            top = list(os.scandir(self.directory))
        except OSError:
            return
        for entry in top:
            try:
                if entry.is_dir(follow_symlinks=False):
                    with os.scandir(entry.path) as inner:
                        for sub in inner:
                            yield sub.path, sub.name
                else:
                    yield entry.path, entry.name
            except OSError:
                continue

    def _discover(self, now: float) -> None:
        prom: list[str] = []
        over = 0
        for path, name in self._candidates():
            if PROM_FILE_RE.match(name):
                prom.append(path)
                continue
            match = FILE_RE.match(name)
            if match is None:
                continue
            try:
                info = os.stat(path)
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if key in self._tails or not stat.S_ISREG(info.st_mode) or now - info.st_mtime > self.ttl:
                continue
            if len(self._tails) >= self.max_files:
                over += 1
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                logger.warning("NCCL Inspector file %s unreadable: %s", path, exc.strerror)
                continue
            start = max(0, info.st_size - self.max_read_bytes)  # a long backlog: read only its end
            host, pid = match.group("host"), int(match.group("pid"))
            host_then, pid_then, offset_then = self._dropped_at.pop(key, ("", -1, -1))
            if (host_then, pid_then) == (host, pid) and 0 <= offset_then <= info.st_size:
                start = offset_then  # an idle file that grows again: go on where reading stopped
            self._tails[key] = _Tail(
                InspectorFile(path, host, pid), fd, key, start,
                size=info.st_size, last_growth=now, resync=start != offset_then and not _at_line_start(fd, start),
            )
        self.stats.prometheus_files = tuple(sorted(prom))
        if over and not self.stats.files_over_limit:
            logger.warning("more than %d NCCL Inspector files under %s: %d not followed", self.max_files,
                           self.directory, over)
        self.stats.files_over_limit = over

    # -- reading -----------------------------------------------------------------------------------

    def poll(self) -> Iterator[tuple[InspectorFile, InspectorRecord]]:
        now = self.clock()
        self._discover(now)
        budget = self.max_read_bytes
        tails = list(self._tails.values())
        if tails:
            self._turn = (self._turn + 1) % len(tails)
            tails = tails[self._turn:] + tails[:self._turn]
        for tail in tails:
            try:
                info = os.fstat(tail.fd)
            except OSError:
                self._drop(tail)
                continue
            if info.st_size < tail.offset:  # truncated in place (copytruncate): start over
                self.stats.truncations += 1
                logger.info("NCCL Inspector file %s was truncated; reading it from the start", tail.file.path)
                tail.offset, tail.resync = 0, False
            if info.st_size != tail.size:
                tail.size, tail.last_growth = info.st_size, now
            while budget > 0 and tail.offset < info.st_size:
                chunk = self._read(tail, min(READ_CHUNK, budget))
                if chunk is None:
                    break
                budget -= len(chunk)
                yield from self._parse_chunk(tail, chunk)
        for tail in list(self._tails.values()):
            if now - tail.last_growth > self.ttl:
                self._drop(tail)
        self.stats.files = len(self._tails)
        self.stats.unread_bytes = sum(max(0, t.size - t.offset) for t in self._tails.values())

    def _read(self, tail: _Tail, size: int) -> bytes | None:
        """Complete lines from the tail's offset, about ``size`` bytes; None when no full line is there yet."""
        try:
            data = os.pread(tail.fd, size, tail.offset)
            end = data.rfind(b"\n")
            if end < 0 and len(data) == size and size < MAX_LINE_BYTES:
                data = os.pread(tail.fd, MAX_LINE_BYTES, tail.offset)  # one line longer than the budget left:
                end = data.find(b"\n")  # that line alone
        except OSError as exc:
            logger.warning("NCCL Inspector file %s: read failed: %s", tail.file.path, exc.strerror)
            return None
        if end >= 0:
            return data[:end + 1]
        if len(data) >= MAX_LINE_BYTES:  # a megabyte without a newline is no record: skip to the next line
            self.stats.skipped["too_long"] += 1
            tail.offset += len(data)
            tail.resync = True
        return None  # otherwise a partial last line: the writer is mid-record
    def _parse_chunk(self, tail: _Tail, chunk: bytes) -> Iterator[tuple[InspectorFile, InspectorRecord]]:
        tail.offset += len(chunk)
        lines = chunk.split(b"\n")
        if tail.resync:
            lines, tail.resync = lines[1:], False  # the rest of a line begun before our start point
        for raw in lines:
            # A copytruncate under the plugin's FILE* (opened "w", so it writes on at its old offset)
            # leaves a hole of NUL bytes where the lines we had not read were.
            line = raw.lstrip(b"\0")
            if not line.strip():
                continue
            if len(line) > MAX_LINE_BYTES:
                self.stats.skipped["too_long"] += 1
                continue
            try:
                record = parse_record(line)
            except MalformedRecord as exc:
                self.stats.skipped[exc.reason] += 1
                logger.debug("NCCL Inspector %s: skipped a line: %s", tail.file.path, exc)
                continue
            self.stats.records[record.kind] += 1
            yield tail.file, record

    # -- lifecycle ---------------------------------------------------------------------------------

    def _drop(self, tail: _Tail) -> None:
        self._tails.pop(tail.inode, None)
        self._dropped_at[tail.inode] = (tail.file.hostname, tail.file.pid, tail.offset)
        while len(self._dropped_at) > REMEMBERED_FILES:
            self._dropped_at.pop(next(iter(self._dropped_at)))
        self._expired.append(tail.file)
        with contextlib.suppress(OSError):
            os.close(tail.fd)

    def expired(self) -> list[InspectorFile]:
        """Files dropped since the last call (idle past the time-to-live, or gone)."""
        out, self._expired = self._expired, []
        return out

    def followed(self) -> list[InspectorFile]:
        return [t.file for t in self._tails.values()]

    def close(self) -> None:
        for tail in list(self._tails.values()):
            self._drop(tail)
        self._expired.clear()
