"""The nccl collector: totals per rank, communicator, operation and size bucket; attribution; expiry; limits."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetscope.collectors import REGISTRY
from fleetscope.collectors.nccl import NcclCollector, size_bucket
from fleetscope.collectors.protocol import collector_class
from fleetscope.config import load
from fleetscope.errors import NoHardware
from fleetscope.metrics import nccl
from fleetscope_sim.inspector import Comm, InspectorNode, RankProcess, record_line
from tests.collectors.helpers import registry_of
from tests.conftest import FIXTURES, ROOT

NODE8 = os.path.join(FIXTURES, "nccl", "node8")
GOLDEN = os.path.join(ROOT, "tests", "golden", "nccl-node8.metrics")
UPDATE_GOLDEN = os.environ.get("FLEETSCOPE_UPDATE_GOLDEN") == "1"


class Clock:
    def __init__(self, now: float = 1_767_230_010.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def collector(dump: str, procfs: str, clock: Clock | None = None, **settings: object) -> NcclCollector:
    """The fixtures' procfs trees have no Uid lines: their files are read as a configured owner's."""
    settings.setdefault("file_owners", str(os.getuid()))
    config = load({"nccl.dir": dump, "path.procfs": procfs, "nccl.ttl": "100000h",
                   **{f"nccl.{k.replace('_', '-')}": v for k, v in settings.items()}}, environ={})
    return NcclCollector(config, clock=clock or Clock())


def exposition(c: NcclCollector) -> str:
    return generate_latest(registry_of(c.collect())).decode()


def test_registered_and_absent_directory_is_no_hardware(tmp_path: Path) -> None:
    assert collector_class(REGISTRY["nccl"]) is NcclCollector
    with pytest.raises(NoHardware, match=r"nccl\.dir"):
        collector(str(tmp_path / "missing"), str(tmp_path)).collect()


@pytest.mark.parametrize("size, bucket", [
    (0, "0-64KiB"), (65535, "0-64KiB"), (65536, "64KiB-1MiB"), (1 << 20, "1-16MiB"), (12 << 20, "1-16MiB"),
    (16 << 20, "16-256MiB"), (256 << 20, "256MiB+"), (1 << 40, "256MiB+"),
])
def test_size_buckets(size: int, bucket: str) -> None:
    assert size_bucket(size) == bucket


def test_node8_fixture_matches_golden() -> None:
    """An 8-rank node of a 3D-parallel Slurm job: every series, attributed to job 81234 and its ranks."""
    text = exposition(collector(os.path.join(NODE8, "dump"), os.path.join(NODE8, "proc")))
    if UPDATE_GOLDEN:
        with open(GOLDEN, "w", encoding="utf-8") as handle:
            handle.write(text)
    with open(GOLDEN, encoding="utf-8") as handle:
        assert text == handle.read()


def test_node8_series_are_bounded_and_attributed() -> None:
    families = list(text_string_to_metric_families(
        exposition(collector(os.path.join(NODE8, "dump"), os.path.join(NODE8, "proc")))))
    samples = [s for f in families for s in f.samples]
    per_rank = [s for s in samples if "comm" in s.labels]
    assert {s.labels["training_job"] for s in per_rank} == {"81234"}
    assert {s.labels["rank"] for s in per_rank} == {str(r) for r in range(8, 16)}
    info = [s for s in samples if s.name == "fleetscope_nccl_communicator_info"]
    assert len(info) == 8 * 4  # tensor, data and pipeline group, and the world, per rank
    # 10 (operation, size bucket) keys per rank, three series each: never one series per message.
    counts = [s for s in samples
              if s.name in ("fleetscope_nccl_collectives_total", "fleetscope_nccl_p2p_operations_total")]
    assert len(counts) == 8 * 10
    assert sum(s.value for s in counts) == 8 * 55  # every record of the fixture counted once
    tp = {s.labels["collective"]: s for s in counts
          if s.labels.get("collective") and s.labels["rank"] == "11" and s.labels["size_bucket"] == "1-16MiB"
          and s.labels["comm_rank"] == "3"}
    assert sorted(tp) == ["AllGather", "AllReduce", "ReduceScatter"]
    assert tp["AllReduce"].value == 10  # two 12 MiB all-reduces a step for five steps


def test_sums_are_the_records_sums(tmp_path: Path) -> None:
    node = InspectorNode(str(tmp_path / "dump"), str(tmp_path / "proc"))
    proc = RankProcess(5, 5, "llm", host_pid=900, pid=900, hostname="node-a")
    node.add_process(proc)
    comm = Comm("0xfeed", 5, 8, 1, "default_pg")
    node.append(proc, [
        record_line(comm, "AllReduce", 1, 25 << 20, 1000, hostname="node-a", pid=900, dump_us=1),
        record_line(comm, "AllReduce", 2, 25 << 20, 3000, hostname="node-a", pid=900, dump_us=2),
        record_line(comm, "AllReduce", 3, 4096, 20, hostname="node-a", pid=900, dump_us=3),
    ])
    registry = registry_of(collector(str(tmp_path / "dump"), str(tmp_path / "proc")).collect())
    labels = {"training_job": "llm", "rank": "5", "comm": "0xfeed", "comm_rank": "5", "collective": "AllReduce",
              "size_bucket": "16-256MiB"}
    assert registry.get_sample_value("fleetscope_nccl_collectives_total", labels) == 2
    assert registry.get_sample_value("fleetscope_nccl_collective_seconds_total", labels) == pytest.approx(4000e-6)
    # Bus bytes / seconds is the time-weighted bus bandwidth: 25 MiB x 2 x 7/8 per all-reduce, in 4 ms.
    bus = registry.get_sample_value("fleetscope_nccl_collective_bus_bytes_total", labels)
    assert bus / 4000e-6 == pytest.approx(2 * (25 << 20) * 2 * 7 / 8 / 4000e-6, rel=1e-5)
    small = {**labels, "size_bucket": "0-64KiB"}
    assert registry.get_sample_value("fleetscope_nccl_collectives_total", small) == 1
    assert registry.get_sample_value("fleetscope_nccl_communicator_info", {
        "training_job": "llm", "rank": "5", "comm": "0xfeed", "comm_rank": "5", "comm_name": "default_pg",
        "comm_ranks": "8", "comm_nodes": "1", "local_rank": "5", "format_version": "v4.0"}) == 1
    assert registry.get_sample_value("fleetscope_nccl_records_total", {"kind": "collective"}) == 3


def test_totals_grow_across_collections_and_dead_communicators_expire(tmp_path: Path) -> None:
    clock = Clock(time.time())
    node = InspectorNode(str(tmp_path / "dump"), str(tmp_path / "proc"))
    proc = RankProcess(0, 0, "llm", host_pid=900, pid=900, hostname="node-a")
    node.add_process(proc)
    c = collector(str(tmp_path / "dump"), str(tmp_path / "proc"), clock, ttl="10m")
    comm = Comm("0xfeed", 0, 2, 1)

    def total() -> float | None:
        return registry_of(c.collect()).get_sample_value("fleetscope_nccl_collectives_total", {
            "training_job": "llm", "rank": "0", "comm": "0xfeed", "comm_rank": "0", "collective": "AllGather",
            "size_bucket": "1-16MiB"})

    node.append(proc, [record_line(comm, "AllGather", 1, 2 << 20, 50, hostname="node-a", pid=900, dump_us=1)])
    assert total() == 1
    node.append(proc, [record_line(comm, "AllGather", 2, 2 << 20, 50, hostname="node-a", pid=900, dump_us=2)])
    clock.now += 30
    assert total() == 2
    clock.now += 601  # the job ended: nothing new for longer than nccl.ttl
    os.utime(node.path_of(proc), (clock.now - 631, clock.now - 631))
    assert total() is None
    registry = registry_of(c.collect())
    assert registry.get_sample_value("fleetscope_nccl_files") == 0
    assert registry.get_sample_value("fleetscope_nccl_records_total", {"kind": "collective"}) == 2


def test_unattributed_writer_keeps_its_series_with_empty_job_and_warns(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    dump.mkdir()
    comm = Comm("0xbeef", 1, 2, 2)
    (dump / "pod-x-pid17.log").write_text(
        record_line(comm, "AllReduce", 1, 1 << 20, 80, hostname="pod-x", pid=17, dump_us=1))
    (tmp_path / "proc").mkdir()  # a daemon without hostPID sees no training process
    c = collector(str(dump), str(tmp_path / "proc"))
    registry = registry_of(c.collect())
    assert registry.get_sample_value("fleetscope_nccl_collectives_total", {
        "training_job": "", "rank": "", "comm": "0xbeef", "comm_rank": "1", "collective": "AllReduce",
        "size_bucket": "1-16MiB"}) == 1
    findings = c.health()
    assert [f.subject for f in findings] == ["inspector pod-x-pid17"]
    assert "hostPID" in findings[0].message


def test_prometheus_textfile_mode_is_reported_not_read(tmp_path: Path) -> None:
    shutil.copytree(os.path.join(FIXTURES, "nccl", "prom"), tmp_path / "dump")
    c = collector(str(tmp_path / "dump"), str(tmp_path))
    registry = registry_of(c.collect())
    assert registry.get_sample_value("fleetscope_nccl_files") == 0
    (finding,) = c.health()
    assert finding.severity == "warning" and "NCCL_INSPECTOR_PROM_DUMP" in finding.message


def test_key_limit_skips_and_counts(tmp_path: Path) -> None:
    node = InspectorNode(str(tmp_path / "dump"), str(tmp_path / "proc"))
    proc = RankProcess(0, 0, "llm", host_pid=900, pid=900, hostname="node-a")
    node.add_process(proc)
    comm = Comm("0xfeed", 0, 2, 1)
    node.append(proc, [
        record_line(comm, op, n, 1 << 20, 10, hostname="node-a", pid=900, dump_us=n)
        for n, op in enumerate(["AllReduce", "AllGather", "ReduceScatter", "AllReduce", "Broadcast"])
    ])
    registry = registry_of(collector(str(tmp_path / "dump"), str(tmp_path / "proc"), max_keys=2).collect())
    assert registry.get_sample_value("fleetscope_nccl_skipped_records_total", {"reason": "key_limit"}) == 2
    counts = [s for f in registry.collect() for s in f.samples if s.name == "fleetscope_nccl_collectives_total"]
    assert sorted((s.labels["collective"], s.value) for s in counts) == [("AllGather", 1), ("AllReduce", 2)]


def test_malformed_lines_are_counted_by_reason() -> None:
    c = collector(os.path.join(FIXTURES, "nccl", "malformed"), os.path.join(FIXTURES, "nccl"))
    registry = registry_of(c.collect())
    skipped = {r: registry.get_sample_value("fleetscope_nccl_skipped_records_total", {"reason": r})
               for r in ("json", "fields", "too_long", "unknown_kind", "key_limit")}
    assert skipped == {"json": 4, "fields": 3, "too_long": 0, "unknown_kind": 1, "key_limit": 0}


def test_every_exported_name_is_in_the_table() -> None:
    names = {spec.name for spec in nccl.TABLE}
    text = exposition(collector(os.path.join(NODE8, "dump"), os.path.join(NODE8, "proc")))
    exported = {f.name for f in text_string_to_metric_families(text)}
    assert {n.removesuffix("_total") for n in names} == exported


# -- the directory is writable by every job, and the daemon reads it as root (#30) ----------------------


def test_a_planted_symlink_to_a_root_only_file_leaves_no_trace(tmp_path: Path) -> None:
    """Measured before: the target's first line became a comm_name label, and json skips gave its line count."""
    secret = tmp_path / "shadow"
    secret.write_text('{"header":{"id":"0x1","comm_name":"root:$6$secret","rank":0,"n_ranks":1},"coll_perf":'
                      '{"coll":"AllReduce","coll_msg_size_bytes":1,"coll_exec_time_us":1}}\n' + "daemon:*:19000\n" * 7)
    secret.chmod(0o600)
    dump = tmp_path / "dump"
    dump.mkdir()
    dump.chmod(0o1777)
    # Named after a live process (this one) whose user owns the target: only the link gives it away.
    link = dump / f"node-a-pid{os.getpid()}.log"
    os.symlink(secret, link)
    if os.geteuid() == 0:
        os.lchown(link, 65534, 65534)  # planted by nobody
    text = exposition(collector(str(dump), "/proc", file_owners=""))
    assert "secret" not in text and "0x1" not in text
    registry = registry_of(collector(str(dump), "/proc", file_owners="").collect())
    assert registry.get_sample_value("fleetscope_nccl_ignored_files", {"reason": "symlink"}) == 1
    for reason in ("json", "fields", "too_long", "unknown_kind", "key_limit"):
        assert registry.get_sample_value("fleetscope_nccl_skipped_records_total", {"reason": reason}) == 0
    assert registry.get_sample_value("fleetscope_nccl_records_total", {"kind": "collective"}) == 0


def test_one_process_cannot_take_every_key(tmp_path: Path) -> None:
    """A writer inventing communicators gets a quarter of nccl.max-keys; a real rank still gets its keys."""
    node = InspectorNode(str(tmp_path / "dump"), str(tmp_path / "proc"))
    flood = RankProcess(0, 0, "other", host_pid=900, pid=900, hostname="node-a")
    rank = RankProcess(1, 1, "llm", host_pid=901, pid=901, hostname="node-a")
    node.add_process(flood)
    node.add_process(rank)
    node.append(flood, [record_line(Comm(f"0x{n:x}", 0, 2, 1, "x" * 500), "AllReduce", n, 1 << 20, 10,
                                    hostname="node-a", pid=900, dump_us=n) for n in range(1, 3001)])
    c = collector(str(tmp_path / "dump"), str(tmp_path / "proc"), max_keys=64, file_owners="")
    c.collect()
    node.append(rank, [record_line(Comm("0xfeed", 1, 2, 1), "AllReduce", 1, 1 << 20, 10, hostname="node-a",
                                   pid=901, dump_us=1)])
    registry = registry_of(c.collect())
    infos = [s for f in registry.collect() for s in f.samples if s.name == "fleetscope_nccl_communicator_info"]
    assert len([s for s in infos if s.labels["training_job"] == "other"]) == 16  # 64 // 4
    assert all(len(s.labels["comm_name"]) <= 128 for s in infos)
    assert registry.get_sample_value("fleetscope_nccl_collectives_total", {
        "training_job": "llm", "rank": "1", "comm": "0xfeed", "comm_rank": "1", "collective": "AllReduce",
        "size_bucket": "1-16MiB"}) == 1
    assert registry.get_sample_value("fleetscope_nccl_skipped_records_total", {"reason": "key_limit"}) == 3000 - 16
