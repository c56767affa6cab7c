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
import dataclasses
import errno
import json
import logging
import math
import os
import re
import stat
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetscope.sources.fs import Root, Unreadable
from fleetscope.sources.gpu_jobs import JobAttribution, attribute_process

logger = logging.getLogger(__name__)

# The plugin's name, and the same with a logrotate suffix: after a rename rotation the plugin goes on
# writing to the renamed file (it never reopens), so a daemon started later must still find it.
FILE_RE = re.compile(r"^(?P<host>.+)-pid(?P<pid>\d+)\.log(?:\.\d+)?$")
PROM_FILE_RE = re.compile(r"^nccl_inspector_metrics_.+\.prom$")
READ_CHUNK = 1 << 20
MAX_LINE_BYTES = 1 << 20  # a verbose record with 64 channels is ~15 KB; a longer "line" is not a record
REMEMBERED_FILES = 4096  # where reading stopped in files dropped as idle, in case they grow again

# Labels a record's text becomes are bounded: the plugin writes the id as "0x%lx" and NCCL's operation names
# are short words; a communicator's name is the job's own (PyTorch's group description), cut to this length.
ID_RE = re.compile(r"^0x[0-9a-fA-F]{1,16}$")
OPERATION_RE = re.compile(r"^[A-Za-z0-9_]{1,32}$")
MAX_NAME_CHARS = 128
MAX_VERSION_CHARS = 16
# Integers the plugin writes are C's 64-bit ones; a bigger one would overflow float arithmetic.
MAX_INT = 1 << 63

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
        if not -MAX_INT <= value < MAX_INT:
            raise MalformedRecord("fields", f"{key} is not a 64-bit integer")
        return value
    if value is None and not required:
        return None
    raise MalformedRecord("fields", f"{key} is not an integer: {value!r}")


def _number(section: Mapping[str, Any], key: str) -> float | None:
    """A double the plugin printed with %lf; it writes NaN as the string "nan"."""
    value = section.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and -MAX_INT <= value < MAX_INT:
        return float(value)
    if isinstance(value, float) and math.isfinite(value):
        return value
    return None


def _str(section: Mapping[str, Any], key: str, required: bool = True) -> str:
    value = section.get(key)
    if isinstance(value, str):
        return value
    if value is None and not required:
        return ""
    raise MalformedRecord("fields", f"{key} is not a string: {value!r}")


def _text(section: Mapping[str, Any], key: str) -> str:
    """An optional string; anything else (a number, a nested object) reads as absent."""
    value = section.get(key)
    return value if isinstance(value, str) else ""


def parse_record(line: str | bytes) -> InspectorRecord:
    """One output line as a record; raises :class:`MalformedRecord` for anything else.

    Anything a writer can put on a line ends here: nesting deeper than the
    parser's recursion limit, integers of hundreds of digits, ids and names of
    any length are all a skipped line, never an exception that would lose the
    lines after it.
    """
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise MalformedRecord("json", str(exc)[:200]) from None
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
    if not ID_RE.match(comm):
        raise MalformedRecord("fields", f"communicator id {comm[:40]!r} is not 0x and 1-16 hex digits")
    operation = _str(perf, op_key)
    if not OPERATION_RE.match(operation):
        raise MalformedRecord("fields", f"operation {operation[:40]!r} is not a word of 1-32 characters")
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
        comm_name=_str(header, "comm_name", required=False)[:MAX_NAME_CHARS],
        comm_nodes=_int(header, "nnodes", required=False),
        sequence=_int(perf, f"{prefix}_sn", required=False),
        bus_bandwidth=None if bus is None else bus * 1e9,
        algo_bandwidth=None if algo is None else algo * 1e9,
        timing_source=_str(perf, f"{prefix}_timing_source", required=False),
        peer=_int(perf, "p2p_peer", required=False) if kind == "p2p" else None,
        format_version=_text(metadata, "inspector_output_format_version")[:MAX_VERSION_CHARS],
        hostname=_text(metadata, "hostname")[:MAX_NAME_CHARS],
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < MAX_INT else None,
        dump_timestamp=stamp / 1e6 if isinstance(stamp, int) and not isinstance(stamp, bool)
        and 0 <= stamp < MAX_INT else None,
    )


# -- which process wrote a file ----------------------------------------------------------------------


@dataclass(frozen=True)
class InspectorFile:
    """One writer's output file: the plugin names it after its host and pid (as the writer sees them)."""

    path: str
    hostname: str
    pid: int
    host_pid: int | None = None  # the writer process, when a live one was found (its pid on the host)


@dataclass(frozen=True)
class Process:
    """A live process as ``/proc/<pid>/status`` shows it to anyone."""

    host_pid: int
    ns_pids: tuple[int, ...]  # NSpid: its pid in each nested pid namespace, the host's first
    uids: tuple[int, ...]  # Uid: real, effective, saved, filesystem

    def may_own(self, uid: int) -> bool:
        """Whether a file owned by ``uid`` can have been created by this process (its effective or fs uid)."""
        return uid in self.uids[1:2] + self.uids[3:4]


def parse_ns_pids(status: str) -> tuple[int, ...]:
    """``NSpid:`` of ``/proc/<pid>/status``: the pid in each nested pid namespace, host's first."""
    return _status_ints(status, "NSpid:")


def _status_ints(status: str, key: str) -> tuple[int, ...]:
    for line in status.splitlines():
        if line.startswith(key):
            try:
                return tuple(int(p) for p in line.split()[1:])
            except ValueError:
                return ()
    return ()


def process_table(procfs: Root) -> dict[int, list[Process]]:
    """Live processes by their innermost pid (what a writer puts in its file name), from world-readable status."""
    table: dict[int, list[Process]] = {}
    try:
        entries = procfs.listdir()
    except Unreadable:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            status = procfs.read_file(entry, "status")
        except Unreadable:
            continue  # exited meanwhile
        ns_pids = parse_ns_pids(status)
        if ns_pids:
            table.setdefault(ns_pids[-1], []).append(Process(int(entry), ns_pids, _status_ints(status, "Uid:")))
    return table


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


def writer_pid(
    procfs: Root, file: InspectorFile, owner: int | None = None, table: Mapping[int, list[Process]] | None = None,
) -> int | None:
    """The host pid of the process that writes ``file``, or None if it cannot be told.

    The pid in the name is the writer's own: inside a container (a Kubernetes
    pod) that is its pid namespace's number, not the host's. Every process
    whose innermost ``NSpid`` equals it is a candidate; with ``owner`` (the
    file's owner) only those that could have created the file. Several
    candidates (many containers have a pid 17) are told apart by the hostname
    the plugin put in the name, which a pod's ``HOSTNAME`` variable carries,
    and then by ``NCCL_INSPECTOR_ENABLE=1``.
    """
    table = process_table(procfs) if table is None else table
    candidates = [p.host_pid for p in table.get(file.pid, ()) if owner is None or p.may_own(owner)]
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
    pid = file.host_pid if file.host_pid is not None else writer_pid(procfs, file)
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
    owner: int = -1  # the file's owner uid
    rank: int = 1  # TRAINING, LIVE or CONFIGURED: which files keep their place when too many compete


# Why a file named like output is not followed; each is a gauge of the files seen in the last scan.
IGNORE_REASONS = ("symlink", "not_regular", "hardlink", "owner", "limit")
# Which files are followed first when more than max_files compete: those a training job's live process
# wrote, then those any live process wrote (its uid owns the file), then a configured owner's files
# whose writer has gone.
TRAINING, LIVE, CONFIGURED = 0, 1, 2
# The plugin writes one file per process; across a rename rotation the same process has two names.
FILES_PER_WRITER = 2
RECHECK = 60.0  # seconds before the writer of a file left unfollowed is looked up again
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class _Found:
    """A regular, singly linked file named like output, as ``lstat`` saw it in the last scan."""

    subdir: str  # "" for the directory itself
    name: str
    inode: tuple[int, int]
    mtime: float
    owner: int


@dataclass
class _Contender:
    """A followed file, or a found one that could be, competing for one of ``max_files`` places."""

    rank: int
    owner: int
    writer: object  # the writer's host pid, or (owner, host, pid) from the name when no live writer is known
    newest: float  # the file's mtime; a followed file sorts before any found one
    tail: _Tail | None = None
    found: _Found | None = None
    file: InspectorFile | None = None


def choose(contenders: list[_Contender], limit: int) -> tuple[list[_Contender], int]:
    """The ``limit`` contenders to follow, and how many were left out.

    At most :data:`FILES_PER_WRITER` files per writer process; then by rank; within a rank, one file per
    owner uid in turn, so no single user can take the places of everyone else's jobs.
    """
    ordered = sorted(contenders, key=lambda c: (c.tail is None, -c.newest))
    per_writer: dict[object, int] = {}
    groups: dict[tuple[int, int], list[_Contender]] = {}
    for contender in ordered:
        held = per_writer.get(contender.writer, 0)
        if held >= FILES_PER_WRITER:
            continue
        per_writer[contender.writer] = held + 1
        groups.setdefault((contender.rank, contender.owner), []).append(contender)
    chosen: list[_Contender] = []
    for rank in (TRAINING, LIVE, CONFIGURED):
        queues = [list(reversed(group)) for (r, _), group in sorted(groups.items()) if r == rank]
        while queues and len(chosen) < limit:
            for queue in queues:
                if len(chosen) < limit:
                    chosen.append(queue.pop())
            queues = [q for q in queues if q]
    return chosen, len(contenders) - len(chosen)


@dataclass
class ReaderStats:
    """What the last poll saw; counters are cumulative for the reader's life."""

    files: int = 0
    unread_bytes: int = 0
    records: dict[RecordKind, int] = field(default_factory=lambda: {"collective": 0, "p2p": 0})
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))
    prometheus_files: tuple[str, ...] = ()
    truncations: int = 0
    ignored: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IGNORE_REASONS, 0))


def _entries(fd: int) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(fd) as entries:
            return list(entries)
    except OSError:
        return []


class InspectorReader:
    """Follows every ``<host>-pid<pid>.log`` in a directory and its direct subdirectories (one per job).

    :meth:`poll` yields ``(file, record)`` for everything completed since the
    last poll, reading at most ``max_read_bytes`` in all; :attr:`stats` is
    updated as it goes. A file whose last change is older than ``ttl`` is not
    picked up, and a followed file that has not grown for ``ttl`` is dropped
    (:meth:`expired` lists those since the last call).

    Every job can write to the directory, and the daemon reads it as root: a
    file is followed only if it is a regular file with one link, opened
    without following a symlink (its subdirectory too), and owned by the user
    of a live process whose pid the name carries (``procfs``) or by one of
    ``owners``. At most ``max_files`` are followed; :func:`choose` says which.
    """

    def __init__(
        self, directory: str, max_read_bytes: int, ttl: float, max_files: int = 256,
        clock: Callable[[], float] = time.time, procfs: Root | None = None, owners: Collection[int] = (),
    ) -> None:
        self.directory = directory
        self.max_read_bytes = max(max_read_bytes, 4096)
        self.ttl = ttl
        self.max_files = max_files
        self.clock = clock
        self.procfs = procfs
        self.owners = frozenset(owners)
        self.stats = ReaderStats()
        self._tails: dict[tuple[int, int], _Tail] = {}
        self._expired: list[InspectorFile] = []
        # inode -> (host, pid, offset) of files dropped as idle: a rotated name keeps host and pid
        self._dropped_at: dict[tuple[int, int], tuple[str, int, int]] = {}
        self._turn = 0  # rotates which file reads first, so a busy file cannot starve the others
        # (inode, subdirectory, name) of unfollowed files -> (when classified, contender or None if refused)
        self._classified: dict[tuple[tuple[int, int], str, str], tuple[float, _Contender | None]] = {}

    # -- discovery ---------------------------------------------------------------------------------

    def exists(self) -> bool:
        return os.path.isdir(self.directory)

    def _scan(self, ignored: dict[str, int], prom: list[str]) -> list[_Found]:
        """Regular, singly linked files named like output in the directory and its direct subdirectories.

        Entries are examined with ``lstat`` through directory descriptors, so a symlinked subdirectory is
        never entered and a symlink never followed.
        """
        found: list[_Found] = []
        try:
            top = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return found
        try:
            for entry in _entries(top):
                if entry.is_dir(follow_symlinks=False):
                    try:
                        sub = os.open(entry.name, DIR_FLAGS, dir_fd=top)
                    except OSError:
                        continue
                    try:
                        for inner in _entries(sub):
                            self._consider(inner, entry.name, found, ignored, prom)
                    finally:
                        os.close(sub)
                else:
                    self._consider(entry, "", found, ignored, prom)
        finally:
            os.close(top)
        return found

    def _consider(
        self, entry: os.DirEntry[str], subdir: str, found: list[_Found], ignored: dict[str, int], prom: list[str],
    ) -> None:
        if PROM_FILE_RE.match(entry.name):
            prom.append(os.path.join(self.directory, subdir, entry.name))
            return
        if not FILE_RE.match(entry.name):
            return
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            return
        if stat.S_ISLNK(info.st_mode):
            ignored["symlink"] += 1
        elif not stat.S_ISREG(info.st_mode):
            ignored["not_regular"] += 1
        elif info.st_nlink != 1:
            ignored["hardlink"] += 1  # a second name of a file someone else may own
        else:
            found.append(_Found(subdir, entry.name, (info.st_dev, info.st_ino), info.st_mtime, info.st_uid))

    def _open(self, found: _Found, ignored: dict[str, int]) -> tuple[int, os.stat_result] | None:
        """The found file, opened without following a link, if it is still what the scan saw."""
        try:
            parent = top = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if found.subdir:
                parent = os.open(found.subdir, DIR_FLAGS, dir_fd=top)
            fd = os.open(found.name, OPEN_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                ignored["symlink"] += 1  # swapped for a link since the scan
            else:
                logger.warning("NCCL Inspector file %s unreadable: %s", self._path(found), exc.strerror)
            return None
        finally:
            if parent != top:
                os.close(parent)
            os.close(top)
        info = os.fstat(fd)
        if (stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == found.inode and info.st_nlink == 1
                and info.st_uid == found.owner):
            return fd, info
        os.close(fd)
        ignored["not_regular"] += 1  # replaced since the scan
        return None

    def _path(self, found: _Found) -> str:
        return os.path.join(self.directory, found.subdir, found.name)

    def _contender(
        self, found: _Found, table: Mapping[int, list[Process]] | None, in_job: dict[int, bool],
    ) -> _Contender | None:
        """The found file with its writer and rank, or None if no live process of its owner wrote it."""
        match = FILE_RE.match(found.name)
        assert match is not None
        file = InspectorFile(self._path(found), match.group("host"), int(match.group("pid")))
        writer = None
        owned = False  # a live process of the file's owner has the pid in its name
        if self.procfs is not None and table is not None:
            owned = any(p.may_own(found.owner) for p in table.get(file.pid, ()))
            writer = writer_pid(self.procfs, file, owner=found.owner, table=table) if owned else None
        if owned and writer is None:
            # Several such processes (pods whose ranks are all pid 17 as root) and none told apart: the daemon
            # cannot read their environments (no CAP_SYS_PTRACE). Read, without a job or rank.
            return _Contender(LIVE, found.owner, (found.owner, file.hostname, file.pid), found.mtime, found=found,
                              file=file)
        if writer is not None:
            if writer not in in_job:
                job = attribute_process(self.procfs, writer) if self.procfs is not None else None
                in_job[writer] = bool(job and job.training_job)
            rank = TRAINING if in_job[writer] else LIVE
            return _Contender(rank, found.owner, writer, found.mtime, found=found,
                              file=dataclasses.replace(file, host_pid=writer))
        if found.owner in self.owners:
            return _Contender(CONFIGURED, found.owner, (found.owner, file.hostname, file.pid), found.mtime,
                              found=found, file=file)
        return None

    def _discover(self, now: float) -> None:
        ignored = dict.fromkeys(IGNORE_REASONS, 0)
        prom: list[str] = []
        fresh = [f for f in self._scan(ignored, prom) if f.inode not in self._tails and now - f.mtime <= self.ttl]
        # Which process wrote a file is looked up once a RECHECK: files left unfollowed (refused, or past the
        # limit) would otherwise cost a scan of the whole process table every poll.
        classified = {(f.inode, f.subdir, f.name): self._classified.get((f.inode, f.subdir, f.name)) for f in fresh}
        stale = [key for key, known in classified.items() if known is None or not 0 <= now - known[0] <= RECHECK]
        table = process_table(self.procfs) if stale and self.procfs is not None else None
        in_job: dict[int, bool] = {}
        contenders = [
            _Contender(t.rank, t.owner, t.file.host_pid if t.file.host_pid is not None else
                       (t.owner, t.file.hostname, t.file.pid), float("inf"), tail=t)
            for t in self._tails.values()
        ]
        for found in fresh:
            key = (found.inode, found.subdir, found.name)
            known = classified[key]
            if known is None or not 0 <= now - known[0] <= RECHECK:
                known = classified[key] = (now, self._contender(found, table, in_job))
            contender = known[1]
            if contender is None:
                ignored["owner"] += 1
            else:
                contenders.append(dataclasses.replace(contender, found=found, newest=found.mtime))
        self._classified = {key: known for key, known in classified.items() if known is not None}
        chosen, left_out = choose(contenders, self.max_files)
        ignored["limit"] = left_out
        keep = {id(c) for c in chosen}
        for contender in contenders:
            if contender.tail is not None and id(contender) not in keep:
                self._drop(contender.tail)  # a better-placed file needs its place; reading resumes if it returns
        for contender in chosen:
            if contender.found is not None and contender.file is not None:
                self._follow(contender, now, ignored)
        self.stats.prometheus_files = tuple(sorted(prom))
        for reason in ("owner", "limit"):
            if ignored[reason] and not self.stats.ignored[reason]:
                logger.warning("NCCL Inspector files under %s not followed (%s): %d", self.directory,
                               "no live process of their owner wrote them" if reason == "owner"
                               else f"more than {self.max_files}", ignored[reason])
        self.stats.ignored = ignored

    def _follow(self, contender: _Contender, now: float, ignored: dict[str, int]) -> None:
        found, file = contender.found, contender.file
        assert found is not None and file is not None
        opened = self._open(found, ignored)
        if opened is None:
            return
        fd, info = opened
        key = found.inode
        start = max(0, info.st_size - self.max_read_bytes)  # a long backlog: read only its end
        host_then, pid_then, offset_then = self._dropped_at.pop(key, ("", -1, -1))
        if (host_then, pid_then) == (file.hostname, file.pid) and 0 <= offset_then <= info.st_size:
            start = offset_then  # an idle file that grows again: go on where reading stopped
        self._tails[key] = _Tail(
            file, fd, key, start, size=info.st_size, last_growth=now,
            resync=start != offset_then and not _at_line_start(fd, start), owner=found.owner, rank=contender.rank,
        )

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
