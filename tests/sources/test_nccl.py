"""The NCCL Inspector reader: each shipped output shape, partial writes, rotation, truncation, garbage, limits."""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
from pathlib import Path

import pytest

from fleetscope.sources.fs import Root
from fleetscope.sources.nccl import (
    MAX_LINE_BYTES,
    MAX_NAME_CHARS,
    InspectorFile,
    InspectorReader,
    InspectorRecord,
    MalformedRecord,
    attribute_writer,
    parse_record,
    writer_pid,
)
from fleetscope_sim.inspector import Comm, InspectorNode, RankProcess, record_line
from tests.conftest import FIXTURES
from tests.sources.unprivileged import NOBODY, TRAINER, as_reader, needs_root, public_directory, trainer_process

NCCL = os.path.join(FIXTURES, "nccl")
# The fixtures' files are this test's own, written by no live process: read as a configured owner's.
MINE = frozenset({os.getuid()})


class Clock:
    def __init__(self, now: float = 1_767_225_600.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def read_all(directory: str, **kwargs: object) -> tuple[list[tuple[InspectorFile, InspectorRecord]], InspectorReader]:
    reader = InspectorReader(directory, max_read_bytes=int(kwargs.pop("max_read_bytes", 1 << 20)),  # type: ignore[call-overload]
                             ttl=float(kwargs.pop("ttl", 1e12)), owners=MINE, **kwargs)  # type: ignore[arg-type]
    return list(reader.poll()), reader


def lines_of(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return handle.read().splitlines(keepends=True)


# -- formats -------------------------------------------------------------------------------------------


def test_nccl_2_28_shape_without_comm_name() -> None:
    got, reader = read_all(os.path.join(NCCL, "v2.28"))
    records = [r for _, r in got]
    assert [(r.comm, r.operation, r.sequence) for r in records] == [
        ("0x5c1f2a3b4d6e7f8", "AllReduce", 412), ("0x1a2b3c4d5e6f708", "AllGather", 1288),
        ("0x5c1f2a3b4d6e7f8", "AllReduce", 413), ("0x1a2b3c4d5e6f708", "ReduceScatter", 1289),
        ("0x5c1f2a3b4d6e7f8", "Broadcast", 414),
    ]
    first = records[0]
    assert dataclasses.replace(first, seconds=0.0, bus_bandwidth=None, algo_bandwidth=None, dump_timestamp=None) == (
        InspectorRecord(
            kind="collective", comm="0x5c1f2a3b4d6e7f8", comm_rank=3, comm_ranks=16, operation="AllReduce",
            message_bytes=26214400, seconds=0.0, comm_name="", comm_nodes=2, sequence=412,
            timing_source="kernel_gpu", format_version="v4.0", hostname="gpu-st-p5-1", pid=51877,
        ))
    assert (first.seconds, first.bus_bandwidth, first.algo_bandwidth, first.dump_timestamp) == pytest.approx(
        (412e-6, 119.300971e9, 63.627184e9, 1767225600.104211))
    files = {f for f, _ in got}
    assert files == {InspectorFile(os.path.join(NCCL, "v2.28", "gpu-st-p5-1-pid51877.log"), "gpu-st-p5-1", 51877)}
    assert reader.stats.records == {"collective": 5, "p2p": 0}
    assert sum(reader.stats.skipped.values()) == 0


def test_nccl_2_30_shape_with_comm_name_and_p2p() -> None:
    got, reader = read_all(os.path.join(NCCL, "v2.30"))
    records = [r for _, r in got]
    assert [(r.kind, r.operation, r.comm_name) for r in records] == [
        ("collective", "AllGather", "default_pg"), ("collective", "ReduceScatter", "default_pg"),
        ("collective", "AllReduce", "default_pg"), ("p2p", "Send", "unknown"), ("p2p", "Recv", "unknown"),
        ("collective", "AllGather", "default_pg"),
    ]
    send = records[3]
    assert (send.peer, send.sequence, send.message_bytes, send.comm_rank, send.comm_ranks) == (2, 3301, 6291456, 1, 4)
    assert send.bus_bandwidth == pytest.approx(142.987636e9)
    # Execution time 0 (below the microsecond): the plugin reports bandwidth 0, not a division by zero.
    assert (records[-1].seconds, records[-1].bus_bandwidth) == (0.0, 0.0)
    assert reader.stats.records == {"collective": 4, "p2p": 2}


@pytest.mark.parametrize("shape", ["v2.28-verbose", "v2.30-verbose"])
def test_verbose_records_parse_and_their_event_traces_are_ignored(shape: str) -> None:
    got, reader = read_all(os.path.join(NCCL, shape))
    assert len(got) == 2 and sum(reader.stats.skipped.values()) == 0
    assert {r.timing_source for _, r in got} == {"kernel_gpu"}


def test_readme_example_shape_without_timing_source() -> None:
    (_, record), = read_all(os.path.join(NCCL, "readme"))[0]
    assert (record.operation, record.timing_source, record.comm_name) == ("AllReduce", "", "")
    assert record.seconds == pytest.approx(131e-6)
    assert record.bus_bandwidth == pytest.approx(448.246229e9)


def test_the_simulator_writes_what_the_plugin_writes() -> None:
    """record_line reproduces the hand-written fixture lines byte for byte, in both shapes."""
    old = lines_of(os.path.join(NCCL, "v2.28", "gpu-st-p5-1-pid51877.log"))
    comm = Comm("0x5c1f2a3b4d6e7f8", rank=3, n_ranks=16, nnodes=2)
    assert record_line(comm, "AllReduce", 412, 26214400, 412, hostname="gpu-st-p5-1", pid=51877,
                       dump_us=1767225600104211, shape="2.28") == old[0]
    new = lines_of(os.path.join(NCCL, "v2.30", "llm-pretrain-worker-3-pid17.log"))
    comm = Comm("0x61c7d3e95a02b48", rank=1, n_ranks=4, nnodes=4)
    assert record_line(comm, "Recv", 3302, 6291456, 47, hostname="llm-pretrain-worker-3", pid=17,
                       dump_us=1767226000512071, p2p_peer=0, git_rev="b3aeda4a") == new[4]
    comm = Comm("0x9b4e2d71c08a3f5", rank=12, n_ranks=32, nnodes=4, name="default_pg")
    assert record_line(comm, "AllReduce", 90213, 8192, 31, hostname="llm-pretrain-worker-3", pid=17,
                       dump_us=1767226000512058, git_rev="b3aeda4a") == new[2]


def test_garbage_is_counted_by_reason_and_skipped() -> None:
    got, reader = read_all(os.path.join(NCCL, "malformed"))
    records = [r for _, r in got]
    assert [r.sequence for r in records] == [412, 417]
    future = records[1]  # unknown fields and a newer format string are ignored; "nan" is no bandwidth
    assert (future.format_version, future.bus_bandwidth, future.algo_bandwidth) == ("v4.1", None, None)
    assert reader.stats.skipped == {"json": 4, "fields": 3, "too_long": 0, "unknown_kind": 1}


@pytest.mark.parametrize("line, reason", [
    (('{"header":{"id":"0x1","rank":0,"n_ranks":2},"coll_perf":{"coll":"AllReduce","coll_msg_size_bytes":1,'
     '"coll_exec_time_us":-5}}'), "fields"),
    (('{"header":{"id":"0x1","rank":true,"n_ranks":2},"coll_perf":{"coll":"AllReduce","coll_msg_size_bytes":1,'
     '"coll_exec_time_us":5}}'), "fields"),
    (('{"header":{"id":"0x1","rank":0,"n_ranks":2},"coll_perf":{"coll":"","coll_msg_size_bytes":1,'
     '"coll_exec_time_us":5}}'), "fields"),
    ('{"header":"x","coll_perf":{}}', "fields"),
    ('{"coll_perf":{"coll":"AllReduce"}}', "fields"),
    ('"just a string"', "json"),
    (('{"header":{"id":"0x1","rank":0,"n_ranks":2},"coll_perf":{"coll":"AllReduce","coll_msg_size_bytes":1,'
     '"coll_exec_time_us":inf}}'), "json"),  # C's %lf of infinity is no JSON
])
def test_parse_record_refuses(line: str, reason: str) -> None:
    with pytest.raises(MalformedRecord) as caught:
        parse_record(line)
    assert caught.value.reason == reason


# -- following files -----------------------------------------------------------------------------------


def comm_line(seq: int, pid: int = 4242, host: str = "node-a", size: int = 1 << 20, exec_us: int = 100) -> str:
    return record_line(Comm("0xabc", rank=1, n_ranks=8, nnodes=1), "AllReduce", seq, size, exec_us,
                       hostname=host, pid=pid, dump_us=1_767_225_600_000_000 + seq)


def sequences(reader: InspectorReader) -> list[int | None]:
    return [r.sequence for _, r in reader.poll()]


def test_a_half_written_last_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "node-a-pid4242.log"
    line = comm_line(2)
    path.write_text(comm_line(1) + line[:57])
    reader = InspectorReader(str(tmp_path), max_read_bytes=1 << 20, ttl=3600, owners=MINE)
    assert sequences(reader) == [1]
    assert sequences(reader) == []  # still half a line: nothing, and nothing counted as malformed
    with path.open("a") as handle:
        handle.write(line[57:] + comm_line(3))
    assert sequences(reader) == [2, 3]
    assert sum(reader.stats.skipped.values()) == 0


def test_rename_rotation_keeps_reading_the_renamed_file_and_finds_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "node-a-pid4242.log"
    path.write_text(comm_line(1))
    reader = InspectorReader(str(tmp_path), max_read_bytes=1 << 20, ttl=3600, owners=MINE)
    assert sequences(reader) == [1]
    writer = path.open("a")  # the plugin's FILE*, kept open across the rotation
    os.rename(path, tmp_path / "node-a-pid4242.log.1")
    path.write_text(comm_line(100))  # logrotate's `create`: a new, empty-then-written file
    writer.write(comm_line(2))
    writer.close()
    assert sorted(s for s in sequences(reader) if s is not None) == [2, 100]
    assert reader.stats.files == 2


def test_copytruncate_with_the_plugins_own_file_position(tmp_path: Path) -> None:
    """The plugin's FILE* is opened "w", not append: after a truncation it writes on at its old offset,
    so the file restarts with a hole of NUL bytes. Lines the reader had not reached are lost, never
    misread; nothing is counted as malformed."""
    path = tmp_path / "node-a-pid4242.log"
    writer = path.open("w")
    writer.write(comm_line(1))
    writer.flush()
    reader = InspectorReader(str(tmp_path), max_read_bytes=1 << 20, ttl=3600, owners=MINE)
    assert sequences(reader) == [1]
    writer.write(comm_line(2))  # written, not yet read...
    writer.flush()
    with path.open("r+") as other:  # ...when logrotate copies and truncates
        other.truncate(0)
    writer.write(comm_line(3))
    writer.close()
    assert path.read_bytes().startswith(b"\0")
    assert sequences(reader) == [3]
    assert sum(reader.stats.skipped.values()) == 0


def test_a_shorter_file_is_read_again_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "node-a-pid4242.log"
    path.write_text(comm_line(1) + comm_line(2))
    reader = InspectorReader(str(tmp_path), max_read_bytes=1 << 20, ttl=3600, owners=MINE)
    assert sequences(reader) == [1, 2]
    with path.open("r+") as handle:
        handle.truncate(0)
    with path.open("a") as handle:  # an appending writer starts at 0 again
        handle.write(comm_line(3))
    assert sequences(reader) == [3]
    assert reader.stats.truncations == 1


def test_reads_at_most_the_budget_per_poll_and_catches_up(tmp_path: Path) -> None:
    path = tmp_path / "node-a-pid4242.log"
    path.write_text("")
    lines = [comm_line(i) for i in range(1, 201)]
    size = sum(len(x) for x in lines)
    reader = InspectorReader(str(tmp_path), max_read_bytes=size // 4, ttl=3600, owners=MINE)
    assert sequences(reader) == []
    path.write_text("".join(lines))  # a burst: four polls' worth
    seen: list[int | None] = []
    polls = 0
    while len(seen) < 200:
        batch = sequences(reader)
        assert 0 < len(batch) <= 200 // 4 + 1
        seen += batch
        assert reader.stats.unread_bytes == size - sum(len(line) for line in lines[:len(seen)])
        polls += 1
    assert seen == list(range(1, 201)) and polls >= 4


@pytest.mark.parametrize("extra", [0, 7])
def test_a_long_backlog_at_start_is_read_from_its_end(tmp_path: Path, extra: int) -> None:
    lines = [comm_line(i) for i in range(1, 101)]
    (tmp_path / "node-a-pid4242.log").write_text("".join(lines))
    budget = sum(len(line) for line in lines[-10:]) + extra  # exactly ten lines, or ten and a piece
    reader = InspectorReader(str(tmp_path), max_read_bytes=budget, ttl=3600, owners=MINE)
    got = sequences(reader)
    assert got == list(range(91, 101))  # a cut line before them is dropped, not counted as malformed
    assert sum(reader.stats.skipped.values()) == 0


def test_a_line_without_end_is_skipped_as_too_long(tmp_path: Path) -> None:
    path = tmp_path / "node-a-pid4242.log"
    path.write_bytes(b"x" * (MAX_LINE_BYTES + 10) + b"\n" + comm_line(1).encode())
    reader = InspectorReader(str(tmp_path), max_read_bytes=4 << 20, ttl=3600, owners=MINE)
    got: list[int | None] = []
    for _ in range(3):
        got += sequences(reader)
    assert got == [1]
    assert reader.stats.skipped["too_long"] == 1


def test_old_files_are_ignored_idle_ones_expire_and_resume_without_rereading(tmp_path: Path) -> None:
    clock = Clock()
    old = tmp_path / "node-a-pid1.log"
    old.write_text(comm_line(1, pid=1))
    os.utime(old, (clock.now - 7200, clock.now - 7200))
    live = tmp_path / "node-a-pid2.log"
    live.write_text(comm_line(1, pid=2))
    os.utime(live, (clock.now, clock.now))
    reader = InspectorReader(str(tmp_path), max_read_bytes=1 << 20, ttl=600, clock=clock, owners=MINE)
    assert [(f.pid, r.sequence) for f, r in reader.poll()] == [(2, 1)]
    clock.now += 601
    assert sequences(reader) == []
    assert [f.pid for f in reader.expired()] == [2] and reader.stats.files == 0
    with live.open("a") as handle:  # a long evaluation pause, then training goes on
        handle.write(comm_line(2, pid=2))
    os.utime(live, (clock.now, clock.now))
    assert sequences(reader) == [2]


def test_per_job_subdirectories_and_prometheus_textfiles(tmp_path: Path) -> None:
    (tmp_path / "81234").mkdir()
    (tmp_path / "81234" / "node-a-pid7.log").write_text(comm_line(5, pid=7))
    shutil.copytree(os.path.join(NCCL, "prom"), tmp_path / "prom")
    (tmp_path / "notes.txt").write_text("not an output file\n")
    reader = InspectorReader(str(tmp_path), max_read_bytes=1 << 20, ttl=1e12, owners=MINE)
    assert sequences(reader) == [5]
    assert [os.path.basename(p) for p in reader.stats.prometheus_files] == [
        "nccl_inspector_metrics_GPU-5b1c7e4a-90d2-4f1e-8c33-2a6f0d9e1b47.prom"]


def test_file_limit(tmp_path: Path) -> None:
    for pid in range(5):
        (tmp_path / f"node-a-pid{pid}.log").write_text(comm_line(1, pid=pid))
    reader = InspectorReader(str(tmp_path), max_read_bytes=1 << 20, ttl=1e12, max_files=3, owners=MINE)
    assert len(sequences(reader)) == 3
    assert reader.stats.ignored["limit"] == 2
    reader.close()
    assert reader.stats.files == 3 and reader.followed() == []


# -- which process wrote a file ------------------------------------------------------------------------


def test_writer_in_the_host_pid_namespace(tmp_path: Path) -> None:
    node = InspectorNode(str(tmp_path / "dump"), str(tmp_path / "proc"))
    node.add_process(RankProcess(rank=9, local_rank=1, job="llm", host_pid=51877, pid=51877, hostname="gpu-st-p5-1"))
    file = InspectorFile(str(tmp_path / "dump" / "gpu-st-p5-1-pid51877.log"), "gpu-st-p5-1", 51877)
    procfs = Root(str(tmp_path / "proc"))
    assert writer_pid(procfs, file) == 51877
    job = attribute_writer(procfs, file)
    assert job is not None and (job.training_job, job.rank, job.local_rank) == ("llm", "9", "1")


def test_writers_in_pods_are_told_apart_by_hostname(tmp_path: Path) -> None:
    """Two pods whose rank processes are both pid 17 inside, and a host process that is pid 17 on the host."""
    node = InspectorNode(str(tmp_path / "dump"), str(tmp_path / "proc"))
    pod = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    node.add_process(RankProcess(3, 3, "llm", host_pid=40017, pid=17, hostname="llm-worker-0"), pod_uid=pod)
    node.add_process(RankProcess(11, 3, "llm", host_pid=40517, pid=17, hostname="llm-worker-1"), pod_uid=pod)
    os.makedirs(tmp_path / "proc" / "17")
    (tmp_path / "proc" / "17" / "status").write_text("Name:\tkthreadd\nNSpid:\t17\n")
    (tmp_path / "proc" / "self").mkdir()
    procfs = Root(str(tmp_path / "proc"))
    file = InspectorFile("x", "llm-worker-1", 17)
    assert writer_pid(procfs, file) == 40517
    job = attribute_writer(procfs, file)
    assert job is not None and (job.rank, job.pod_uid) == ("11", pod)
    # No candidate carries the name: unknown rather than a guess.
    assert writer_pid(procfs, InspectorFile("x", "llm-worker-9", 17)) is None
    assert writer_pid(procfs, InspectorFile("x", "gone", 999)) is None


# -- real output from a GPU machine (scripts/nccl-inspector-capture) ------------------------------------

REAL = sorted(d for d in glob.glob(os.path.join(NCCL, "real-*")) if os.path.isdir(d))


@pytest.mark.parametrize("directory", REAL or [None], ids=lambda d: os.path.basename(d) if d else "none-yet")
def test_real_plugin_output_parses_whole(directory: str | None) -> None:
    if directory is None:
        pytest.skip("no real-GPU Inspector output committed yet: scripts/nccl-inspector-capture (docs/deploy.md)")
    got, reader = read_all(directory)
    assert got, "a real fixture without records"
    assert sum(reader.stats.skipped.values()) == 0, reader.stats.skipped
    with open(os.path.join(directory, "MANIFEST"), encoding="utf-8") as handle:
        manifest = dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)
    timing = "kernel_gpu" if manifest.get("timing") == "default" else None
    for file, record in got:
        assert record.format_version and record.hostname == file.hostname and record.pid == file.pid
        assert record.comm.startswith("0x") and record.comm_ranks == 1 and record.seconds >= 0
        if timing:
            assert record.timing_source == timing


# -- hostile writers: the directory is writable by every job, and the daemon reads it as root (#30) ----


def good_lines(count: int, pid: int = 4242) -> list[str]:
    return [comm_line(i, pid=pid) for i in range(1, count + 1)]


HOSTILE_LINES = [
    "[" * 100_000 + "]" * 100_000 + "\n",  # deeper than the parser's recursion limit: RecursionError
    comm_line(9999).replace('"coll_exec_time_us":100', '"coll_exec_time_us":' + "9" * 400),  # OverflowError
    comm_line(9999).replace('"dump_timestamp_us":', '"dump_timestamp_us":' + "9" * 400),
    comm_line(9999).replace('"coll_busbw_gbs":', '"coll_busbw_gbs":' + "9" * 400),
    comm_line(9999).replace('"hostname":"node-a"', '"hostname":' + "[" * 5000 + "]" * 5000),
    comm_line(9999).replace('"0xabc"', '"0x' + "a" * 4000 + '"'),  # an id of any length would be a label
    comm_line(9999).replace('"AllReduce"', '"' + "A" * 4000 + '"'),
]


@pytest.mark.parametrize("hostile", HOSTILE_LINES, ids=["nested", "exec-digits", "stamp-digits", "busbw-digits",
                                                         "nested-hostname", "long-id", "long-operation"])
def test_one_hostile_line_costs_that_line_only(tmp_path: Path, hostile: str) -> None:
    """Measured before: RecursionError/OverflowError out of the parser; 200 good records of 500 lost uncounted."""
    lines = good_lines(500)
    (tmp_path / "node-a-pid4242.log").write_text("".join(lines[:300]) + hostile + "".join(lines[300:]))
    got, reader = read_all(str(tmp_path))
    assert [r.sequence for _, r in got if r.sequence != 9999] == list(range(1, 501))
    # The hostile line is skipped and counted, or read without the optional field it spoiled.
    assert len(got) - 500 + sum(reader.stats.skipped.values()) == 1, reader.stats.skipped


def test_a_long_communicator_name_is_cut_not_kept_whole() -> None:
    line = comm_line(1).replace('"comm_name":"unknown"', '"comm_name":"' + "n" * 100_000 + '"')
    assert len(parse_record(line).comm_name) == MAX_NAME_CHARS


def test_a_planted_symlink_or_hard_link_is_not_followed(tmp_path: Path) -> None:
    """Any user may plant a link named like an output file; the daemon, root, would read its target."""
    secret = tmp_path / "secret"
    secret.write_text(comm_line(1) + "root-only line\n" * 7)
    secret.chmod(0o600)
    dump = tmp_path / "dump"
    dump.mkdir()
    os.symlink(secret, dump / "node-a-pid4242.log")
    (dump / "81234").mkdir()
    os.symlink(secret, dump / "81234" / "node-a-pid4243.log")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "node-a-pid4245.log").write_text(comm_line(1))
    os.symlink(tmp_path / "elsewhere", dump / "81235")  # a linked subdirectory is not entered either
    os.link(secret, dump / "node-a-pid4244.log")
    got, reader = read_all(str(dump))
    assert got == []
    assert sum(reader.stats.skipped.values()) == 0  # not even the line count leaks
    assert reader.stats.ignored["symlink"] == 2 and reader.stats.ignored["hardlink"] == 1


def test_a_file_swapped_for_a_symlink_after_the_scan_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(comm_line(1))
    dump = tmp_path / "dump"
    dump.mkdir()
    planted = dump / "node-a-pid4242.log"
    planted.write_text(comm_line(2))
    reader = InspectorReader(str(dump), max_read_bytes=1 << 20, ttl=1e12, owners=MINE)
    real_scan = reader._scan

    def swap_after_scan(*args: object) -> object:
        found = real_scan(*args)  # type: ignore[arg-type]
        planted.unlink()
        os.symlink(secret, planted)
        return found

    reader._scan = swap_after_scan  # type: ignore[method-assign]
    assert sequences(reader) == []


def test_device_nodes_and_fifos_are_not_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "node-a-pid4242.log")
    got, reader = read_all(str(tmp_path))
    assert got == [] and reader.stats.ignored["not_regular"] == 1


def add_status(procfs: Path, host_pid: int, uid: int, ns_pid: int | None = None, name: str = "bash") -> None:
    base = procfs / str(host_pid)
    base.mkdir(parents=True, exist_ok=True)
    ns = f"{host_pid}\t{ns_pid}" if ns_pid else str(host_pid)
    (base / "status").write_text(f"Name:\t{name}\nPid:\t{host_pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{ns}\n")
    (base / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")


def test_a_file_is_read_only_when_a_live_process_of_its_owner_wrote_it(tmp_path: Path) -> None:
    """The name says which process wrote the file; only that process's user could have created it."""
    me = os.getuid()
    node = InspectorNode(str(tmp_path / "dump"), str(tmp_path / "proc"))
    rank = RankProcess(rank=3, local_rank=3, job="llm", host_pid=5003, pid=5003, hostname="node-a")
    node.add_process(rank)
    node.append(rank, [comm_line(1, pid=5003)])
    add_status(tmp_path / "proc", 6000, uid=me + 1)  # another user's live process
    (tmp_path / "dump" / "node-a-pid6000.log").write_text(comm_line(2, pid=6000))  # ...named, but not written, by it
    (tmp_path / "dump" / "node-a-pid7000.log").write_text(comm_line(3, pid=7000))  # no such process
    reader = InspectorReader(str(tmp_path / "dump"), max_read_bytes=1 << 20, ttl=1e12,
                             procfs=Root(str(tmp_path / "proc")))
    got = list(reader.poll())
    assert [(f.pid, f.host_pid, r.sequence) for f, r in got] == [(5003, 5003, 1)]
    assert reader.stats.ignored["owner"] == 2
    # A configured owner's files are read without a live writer (a job that ended before the daemon started).
    trusting = InspectorReader(str(tmp_path / "dump"), max_read_bytes=1 << 20, ttl=1e12,
                               procfs=Root(str(tmp_path / "proc")), owners=MINE)
    assert sorted((f.pid, f.host_pid) for f, _ in trusting.poll()) == [(5003, 5003), (6000, None), (7000, None)]


def test_training_jobs_files_are_read_before_a_crowd_of_others(tmp_path: Path) -> None:
    """Measured before: 256 fresh files from any user left real jobs' files unread."""
    node = InspectorNode(str(tmp_path / "dump"), str(tmp_path / "proc"))
    ranks = [RankProcess(rank=r, local_rank=r, job="llm", host_pid=5000 + r, pid=5000 + r, hostname="node-a")
             for r in range(4)]
    for rank in ranks:
        node.add_process(rank)
        node.append(rank, [comm_line(1, pid=rank.pid)])
    crowd = tmp_path / "dump" / "crowd"
    crowd.mkdir()
    for n in range(64):  # live processes, but no training job's, each with files under many host names
        add_status(tmp_path / "proc", 9000 + n, uid=os.getuid())
        for host in range(4):
            (crowd / f"h{host}-pid{9000 + n}.log").write_text(comm_line(1, pid=9000 + n))
    reader = InspectorReader(str(tmp_path / "dump"), max_read_bytes=64 << 20, ttl=1e12, max_files=16,
                             procfs=Root(str(tmp_path / "proc")))
    got = list(reader.poll())
    assert {f.pid for f, _ in got} >= {r.pid for r in ranks}
    assert reader.stats.files == 16
    # One process's output is one file (two across a rotation), whatever names it plants.
    crowd_files = [f for f in reader.followed() if f.pid >= 9000]
    assert len(crowd_files) == 12
    assert max(sum(1 for f in crowd_files if f.pid == pid) for pid in {f.pid for f in crowd_files}) <= 2
    assert reader.stats.ignored["limit"] == 64 * 4 - 12


def test_writers_no_environment_tells_apart_are_read_without_a_job(tmp_path: Path) -> None:
    """Under `drop: [ALL]` the daemon cannot read environments: two root pods' pid-17 ranks stay ambiguous."""
    node = InspectorNode(str(tmp_path / "dump"), str(tmp_path / "proc"))
    pod = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    ranks = [RankProcess(3, 3, "llm", host_pid=40017, pid=17, hostname="llm-worker-0"),
             RankProcess(11, 3, "llm", host_pid=40517, pid=17, hostname="llm-worker-1")]
    for rank in ranks:
        node.add_process(rank, pod_uid=pod)
        node.append(rank, [comm_line(rank.rank, pid=17, host=rank.hostname)])
        (tmp_path / "proc" / str(rank.host_pid) / "environ").unlink()  # EACCES without CAP_SYS_PTRACE
    reader = InspectorReader(str(tmp_path / "dump"), max_read_bytes=1 << 20, ttl=1e12,
                             procfs=Root(str(tmp_path / "proc")))
    assert sorted((f.hostname, f.host_pid, r.sequence) for f, r in reader.poll()) == [
        ("llm-worker-0", None, 3), ("llm-worker-1", None, 11)]
    assert reader.stats.ignored["owner"] == 0


@needs_root
@pytest.mark.parametrize("who", ["root-drop-all", "nobody"])
def test_the_owner_check_works_without_any_capability(who: str) -> None:
    """The writer's uid and pid come from world-readable /proc/<pid>/status: the DaemonSet's reader (root, every
    capability dropped) tells a rank's own file from one another user planted under its name."""
    with trainer_process({"RANK": "5"}) as trainer, public_directory() as dump:
        own = os.path.join(dump, f"node-a-pid{trainer.pid}.log")
        planted = os.path.join(dump, f"node-b-pid{trainer.pid}.log")
        for path, owner, seq in ((own, TRAINER, 1), (planted, NOBODY, 2)):
            with open(path, "w") as handle:
                handle.write(comm_line(seq, pid=trainer.pid))
            os.chown(path, owner, owner)

        def read() -> tuple[list[tuple[int | None, int | None]], dict[str, int]]:
            reader = InspectorReader(dump, max_read_bytes=1 << 20, ttl=1e12, procfs=Root("/proc"))
            got = [(f.host_pid, r.sequence) for f, r in reader.poll()]
            return got, reader.stats.ignored

        got, ignored = as_reader(who, read)
    assert got == [[trainer.pid, 1]] and ignored["owner"] == 1


def test_files_left_unfollowed_cost_one_process_scan_a_minute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory of refused files (ended jobs', planted ones) must not scan every process at every poll."""
    import fleetscope.sources.nccl as module

    scans = []
    real = module.process_table
    monkeypatch.setattr(module, "process_table", lambda procfs: scans.append(1) or real(procfs))
    clock = Clock()
    (tmp_path / "proc").mkdir()
    for pid in range(100, 140):
        (tmp_path / f"node-a-pid{pid}.log").write_text(comm_line(1, pid=pid))
        os.utime(tmp_path / f"node-a-pid{pid}.log", (clock.now, clock.now))
    reader = InspectorReader(str(tmp_path), max_read_bytes=1 << 20, ttl=3600, clock=clock,
                             procfs=Root(str(tmp_path / "proc")))
    for _ in range(5):
        assert sequences(reader) == []
        clock.now += 10
    assert len(scans) == 1 and reader.stats.ignored["owner"] == 40
    add_status(tmp_path / "proc", 120, uid=os.getuid())  # pid reused by a process of the files' owner
    clock.now += 20
    assert sequences(reader) == [1] and len(scans) == 2
