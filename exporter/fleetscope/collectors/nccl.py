"""The ``nccl`` collector: NCCL Inspector records summed per rank, communicator, operation and size bucket.

Every record the reader yields is added to running totals (count, execution
seconds, bus bytes) under the key (writer process, communicator, rank in it,
collective or P2P operation, message-size bucket): never one series per
message size or per record. Bus bytes are the record's bus bandwidth times
its time, so ``rate(bus_bytes) / rate(seconds)`` is the time-weighted bus
bandwidth the plugin measured, with its own per-collective factors.

``training_job`` and ``rank`` come from the writer process, found from the
file name through procfs and attributed exactly as the GPU collector
attributes a GPU's processes (Slurm, Kubernetes, environment). A
communicator that logs nothing for ``nccl.ttl`` is forgotten with its series;
beyond ``nccl.max-keys`` totals a new key is counted as skipped, never exported.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from fleetscope.collectors.protocol import Closeable, Collector, Finding, HealthCheck
from fleetscope.config import Config
from fleetscope.errors import NoHardware
from fleetscope.metrics import nccl
from fleetscope.metrics.families import FamilyBuilder
from fleetscope.sources.fs import Root
from fleetscope.sources.gpu_jobs import JobAttribution
from fleetscope.sources.nccl import (
    IGNORE_REASONS,
    SKIP_REASONS,
    InspectorFile,
    InspectorReader,
    InspectorRecord,
    RecordKind,
    attribute_writer,
)

logger = logging.getLogger(__name__)

OVER_LIMIT = "key_limit"
# (count, seconds, bus bytes) families of each record kind.
FAMILIES = {
    "collective": (nccl.COLLECTIVES_TOTAL, nccl.COLLECTIVE_SECONDS_TOTAL, nccl.COLLECTIVE_BUS_BYTES_TOTAL),
    "p2p": (nccl.P2P_OPERATIONS_TOTAL, nccl.P2P_SECONDS_TOTAL, nccl.P2P_BUS_BYTES_TOTAL),
}
ATTRIBUTION_RETRY = 60.0  # seconds before a writer nobody could name is looked up again
# No one process may hold more than this share of nccl.max-keys: a writer that invents communicators cannot
# take every other rank's place (a rank of a 3D-parallel job holds about 10 keys).
KEY_SHARE = 4
MIN_WRITER_KEYS = 16  # ...but never fewer than this (or the whole budget, if that is smaller)

def size_bucket(message_bytes: int) -> str:
    """The contract's bucket of a message size. NCCL switches protocol (LL, LL128, Simple) across these sizes,
    and a training step's collectives (gradient buckets, FSDP shards, activations) fall in two or three."""
    for bound, label in nccl.SIZE_BUCKETS:
        if message_bytes < bound:
            return label
    return nccl.LAST_SIZE_BUCKET


@dataclass
class _Totals:
    count: int = 0
    seconds: float = 0.0
    bus_bytes: float = 0.0


Writer = tuple[str, int]  # (hostname, pid) as the file name gives them


@dataclass
class _RankComm:
    """One rank process's view of one communicator."""

    writer: Writer
    host_pid: int | None  # the writer process found at discovery, if any
    comm: str
    comm_rank: int
    comm_ranks: int
    comm_nodes: int | None
    comm_name: str
    format_version: str
    last_record: float
    totals: dict[tuple[RecordKind, str, str], _Totals] = field(default_factory=dict)


@dataclass
class _Attribution:
    job: JobAttribution | None
    looked_up: float


class NcclCollector(Collector, HealthCheck, Closeable):
    name = "nccl"
    tables = (nccl.TABLE,)

    def __init__(self, config: Config, clock: Callable[[], float] = time.time) -> None:
        settings = config.nccl
        self.clock = clock
        self.ttl = settings.ttl
        self.max_keys = settings.max_keys
        self.max_keys_per_writer = max(min(settings.max_keys, MIN_WRITER_KEYS), settings.max_keys // KEY_SHARE)
        self.procfs = Root(config.path.procfs)
        self.reader = InspectorReader(settings.dir, settings.max_read_bytes, settings.ttl, clock=clock,
                                      procfs=self.procfs, owners=settings.file_owners)
        self._comms: dict[tuple[Writer, str, int], _RankComm] = {}
        self._keys = 0
        self._writer_keys: dict[Writer, int] = {}
        self._over_limit = 0
        self._attribution: dict[Writer, _Attribution] = {}
        self._warned_prometheus = False
        self._lock = threading.Lock()

    # -- reading -----------------------------------------------------------------------------------

    def _add(self, file: InspectorFile, record: InspectorRecord, now: float) -> None:
        writer = (file.hostname, file.pid)
        comm_key = (writer, record.comm, record.comm_rank)
        comm = self._comms.get(comm_key)
        key = (record.kind, record.operation, size_bucket(record.message_bytes))
        totals = None if comm is None else comm.totals.get(key)
        if totals is None:
            # Checked before a communicator is created: every communicator holds at least one key, so its
            # info series is bounded with the keys.
            held = self._writer_keys.get(writer, 0)
            if self._keys >= self.max_keys or held >= self.max_keys_per_writer:
                self._over_limit += 1
                return
            if comm is None:
                comm = self._comms[comm_key] = _RankComm(
                    writer, file.host_pid, record.comm, record.comm_rank, record.comm_ranks, record.comm_nodes,
                    record.comm_name, record.format_version, now,
                )
            totals = comm.totals[key] = _Totals()
            self._keys += 1
            self._writer_keys[writer] = held + 1
        assert comm is not None
        comm.last_record = now
        comm.comm_name = record.comm_name or comm.comm_name
        comm.format_version = record.format_version or comm.format_version
        totals.count += 1
        totals.seconds += record.seconds
        if record.bus_bandwidth is not None:
            totals.bus_bytes += record.bus_bandwidth * record.seconds

    def _expire(self, now: float) -> None:
        for key, comm in list(self._comms.items()):
            if now - comm.last_record > self.ttl:
                self._keys -= len(comm.totals)
                held = self._writer_keys.pop(comm.writer, 0) - len(comm.totals)
                if held > 0:
                    self._writer_keys[comm.writer] = held
                del self._comms[key]
        live = {comm.writer for comm in self._comms.values()}
        for writer in list(self._attribution):
            if writer not in live:
                del self._attribution[writer]

    def _job_of(self, writer: Writer, host_pid: int | None, now: float) -> JobAttribution | None:
        known = self._attribution.get(writer)
        if known is None or (known.job is None and now - known.looked_up > ATTRIBUTION_RETRY):
            file = InspectorFile("", writer[0], writer[1], host_pid)
            known = self._attribution[writer] = _Attribution(attribute_writer(self.procfs, file), now)
        return known.job

    def update(self) -> None:
        """Read everything new and fold it into the totals."""
        if not self.reader.exists():
            raise NoHardware(f"no NCCL Inspector output directory {self.reader.directory} (nccl.dir)")
        now = self.clock()
        for file, record in self.reader.poll():
            self._add(file, record, now)
        self.reader.expired()
        self._expire(now)
        prometheus = self.reader.stats.prometheus_files
        if prometheus and not self._warned_prometheus:
            logger.warning("NCCL Inspector writes Prometheus textfiles (NCCL_INSPECTOR_PROM_DUMP=1) in %s: "
                           "fleetscope reads its JSON output only; unset NCCL_INSPECTOR_PROM_DUMP", prometheus[0])
        self._warned_prometheus = bool(prometheus)

    # -- metrics -----------------------------------------------------------------------------------

    def collect(self) -> list[Metric]:
        with self._lock:
            self.update()
            now = self.clock()
            builder = FamilyBuilder()
            for comm in sorted(self._comms.values(), key=lambda c: (c.writer, c.comm, c.comm_rank)):
                job = self._job_of(comm.writer, comm.host_pid, now)
                labels = (job.training_job if job else "", job.rank if job else "", comm.comm, str(comm.comm_rank))
                builder.add_info(nccl.COMMUNICATOR_INFO, labels, {
                    "comm_name": comm.comm_name, "comm_ranks": str(comm.comm_ranks),
                    "comm_nodes": "" if comm.comm_nodes is None else str(comm.comm_nodes),
                    "local_rank": job.local_rank if job else "", "format_version": comm.format_version,
                })
                for (kind, operation, bucket), totals in sorted(comm.totals.items()):
                    count, seconds, bus_bytes = FAMILIES[kind]
                    series = (*labels, operation, bucket)
                    builder.add(count, series, totals.count)
                    builder.add(seconds, series, totals.seconds)
                    builder.add(bus_bytes, series, totals.bus_bytes)
            stats = self.reader.stats
            builder.add(nccl.FILES, (), stats.files)
            for kind, records in stats.records.items():
                builder.add(nccl.RECORDS_TOTAL, (kind,), records)
            for reason in SKIP_REASONS:
                builder.add(nccl.SKIPPED_RECORDS_TOTAL, (reason,), stats.skipped[reason])
            builder.add(nccl.SKIPPED_RECORDS_TOTAL, (OVER_LIMIT,), self._over_limit)
            builder.add(nccl.UNREAD_BYTES, (), stats.unread_bytes)
            for reason in IGNORE_REASONS:
                builder.add(nccl.IGNORED_FILES, (reason,), stats.ignored[reason])
            return builder.families()

    def health(self) -> list[Finding]:
        with self._lock:
            self.update()
            now = self.clock()
            out = [
                Finding(
                    "nccl", "warning", "inspector",
                    f"{path} is Prometheus textfile output (NCCL_INSPECTOR_PROM_DUMP=1), which has no rank, "
                    "communicator id or count: fleetscope reads the JSON output, so unset NCCL_INSPECTOR_PROM_DUMP",
                )
                for path in self.reader.stats.prometheus_files[:1]
            ]
            out += [
                Finding(
                    "nccl", "warning", f"inspector {writer[0]}-pid{writer[1]}",
                    "no process found for this output file: training_job and rank stay empty "
                    "(a containerised daemon needs hostPID)",
                )
                for writer, host_pid in sorted({c.writer: c.host_pid for c in self._comms.values()}.items())
                if self._job_of(writer, host_pid, now) is None
            ]
            ignored = self.reader.stats.ignored
            if ignored["owner"]:
                out.append(Finding(
                    "nccl", "warning", "inspector",
                    f"{ignored['owner']} Inspector file(s) in {self.reader.directory} not read: no live process of "
                    "their owner has the pid in their name (a containerised daemon needs hostPID; files of ended "
                    "jobs need nccl.file-owners)",
                ))
            return out

    def close(self) -> None:
        self.reader.close()
