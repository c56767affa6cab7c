"""NCCL Inspector plugin output, summed per rank process, communicator, operation and message-size bucket.

docs/nccl-inspector.md describes the plugin's files and fields, and the series count.
"""

from __future__ import annotations

from fleetscope.metrics.spec import MetricSpec, table

PREFIX = "fleetscope_nccl_"
# One rank process's view of one communicator: its training job and rank (attributed from the writer
# process), the communicator's hash and the rank's index in it.
WRITER_LABELS = ("training_job", "rank", "comm", "comm_rank")
COLLECTIVE_LABELS = (*WRITER_LABELS, "collective", "size_bucket")
P2P_LABELS = (*WRITER_LABELS, "operation", "size_bucket")
# Message-size buckets, powers of 16 from 64 KiB: (exclusive upper bound in bytes, label); the last is open.
SIZE_BUCKETS: tuple[tuple[int, str], ...] = (
    (64 << 10, "0-64KiB"),
    (1 << 20, "64KiB-1MiB"),
    (16 << 20, "1-16MiB"),
    (256 << 20, "16-256MiB"),
)
LAST_SIZE_BUCKET = "256MiB+"
# Collectives every rank of a communicator enters together: the last to arrive waits least.
SYNCHRONOUS_COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "AllGatherV", "All2All", "Broadcast", "Reduce")
_BUCKETS = "size_bucket: message size 0-64KiB, 64KiB-1MiB, 1-16MiB, 16-256MiB, 256MiB+."

COLLECTIVES_TOTAL = MetricSpec(
    "fleetscope_nccl_collectives_total", "counter",
    "Collectives the Inspector recorded for this rank of this communicator (NCCL before 2.30 records one sample "
    "per dump, not every collective). " + _BUCKETS,
    COLLECTIVE_LABELS, raw="coll_perf")
COLLECTIVE_SECONDS_TOTAL = MetricSpec(
    "fleetscope_nccl_collective_seconds_total", "counter",
    "Execution time of those collectives on this rank: the transfer plus the wait for the last rank to arrive, "
    "so the rank that arrives last has the shortest.",
    COLLECTIVE_LABELS, unit="seconds", raw="coll_exec_time_us")
COLLECTIVE_BUS_BYTES_TOTAL = MetricSpec(
    "fleetscope_nccl_collective_bus_bytes_total", "counter",
    "Bus bandwidth times execution time of those collectives (the plugin's busbw): divided by the seconds "
    "counter, the time-weighted bus bandwidth in bytes per second.",
    COLLECTIVE_LABELS, unit="bytes", raw="coll_busbw_gbs * coll_exec_time_us")
P2P_OPERATIONS_TOTAL = MetricSpec(
    "fleetscope_nccl_p2p_operations_total", "counter",
    "Point-to-point operations (Send, Recv) the Inspector recorded for this rank (NCCL 2.30 on). " + _BUCKETS,
    P2P_LABELS, raw="p2p_perf")
P2P_SECONDS_TOTAL = MetricSpec(
    "fleetscope_nccl_p2p_seconds_total", "counter",
    "Execution time of those point-to-point operations on this rank.",
    P2P_LABELS, unit="seconds", raw="p2p_exec_time_us")
P2P_BUS_BYTES_TOTAL = MetricSpec(
    "fleetscope_nccl_p2p_bus_bytes_total", "counter",
    "Bus bandwidth times execution time of those point-to-point operations.",
    P2P_LABELS, unit="bytes", raw="p2p_busbw_gbs * p2p_exec_time_us")
COMMUNICATOR_INFO = MetricSpec(
    "fleetscope_nccl_communicator_info", "info",
    "A communicator one rank process on this node belongs to: its name (NCCL 2.30 on), size and node count as "
    "the plugin logged them, the process's local rank and the plugin's output format.",
    WRITER_LABELS, raw="header, metadata",
    info_keys=("comm_name", "comm_ranks", "comm_nodes", "local_rank", "format_version"))
FILES = MetricSpec(
    "fleetscope_nccl_files", "gauge",
    "Inspector output files being followed (one per rank process; idle ones are dropped after nccl.ttl).",
    raw="<nccl.dir>/<host>-pid<pid>.log")
RECORDS_TOTAL = MetricSpec(
    "fleetscope_nccl_records_total", "counter", "Inspector records read, by kind (collective, p2p).", ("kind",))
SKIPPED_RECORDS_TOTAL = MetricSpec(
    "fleetscope_nccl_skipped_records_total", "counter",
    "Inspector output lines not counted, by reason: json (not a JSON object, or nested too deep), fields (a "
    "required field missing or wrong, a number past 64 bits, an id or operation name too long), too_long, "
    "unknown_kind (neither coll_perf nor p2p_perf), key_limit (past nccl.max-keys, or the writer's quarter of it).",
    ("reason",))
UNREAD_BYTES = MetricSpec(
    "fleetscope_nccl_unread_bytes", "gauge",
    "Inspector output written but not read yet (more than nccl.max-read-bytes arrived in one interval).",
    unit="bytes")

IGNORED_FILES = MetricSpec(
    "fleetscope_nccl_ignored_files", "gauge",
    "Files named like Inspector output not followed in the last scan, by reason: symlink, not_regular (a FIFO, "
    "a device), hardlink (more than one name), owner (no live process of the file's owner has the pid in its "
    "name, and the owner is not in nccl.file-owners), limit (more files than the reader follows; training jobs' "
    "first, then shared fairly between users).",
    ("reason",))

TABLE = table(
    "nccl",
    "NCCL Inspector plugin output (the jobs' NCCL_INSPECTOR_DUMP_DIR), one file per rank process; "
    "docs/nccl-inspector.md has the formats and the series count.",
    [
        ("collectives", COLLECTIVES_TOTAL),
        ("collective_seconds", COLLECTIVE_SECONDS_TOTAL),
        ("collective_bus_bytes", COLLECTIVE_BUS_BYTES_TOTAL),
        ("p2p", P2P_OPERATIONS_TOTAL),
        ("p2p_seconds", P2P_SECONDS_TOTAL),
        ("p2p_bus_bytes", P2P_BUS_BYTES_TOTAL),
        ("communicator", COMMUNICATOR_INFO),
        ("files", FILES),
        ("records", RECORDS_TOTAL),
        ("skipped", SKIPPED_RECORDS_TOTAL),
        ("unread", UNREAD_BYTES),
        ("ignored", IGNORED_FILES),
    ],
)
