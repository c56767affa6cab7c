"""Process liveness from a procfs tree: same PID namespace, a container's, gone, and never seen."""

from __future__ import annotations

import os
from pathlib import Path

from fleetscope.push.process import RESCAN_AFTER, ProcessTable
from fleetscope.wire import process_start_time


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def add_process(procfs: Path, pid: int, start: int, namespace_pid: int | None = None) -> None:
    directory = procfs / str(pid)
    directory.mkdir(parents=True)
    (directory / "stat").write_text(
        f"{pid} (python3 train.py) S 1 {pid} {pid} 0 -1 4194560 10 0 0 0 5 1 0 0 20 0 3 0 {start} 1000 50 0\n"
    )
    nspid = f"{pid}\t{namespace_pid}" if namespace_pid is not None else str(pid)
    (directory / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nNSpid:\t{nspid}\n")


def remove_process(procfs: Path, pid: int) -> None:
    for name in ("stat", "status"):
        (procfs / str(pid) / name).unlink()
    (procfs / str(pid)).rmdir()


def test_a_process_in_the_daemons_namespace_is_alive_then_gone(tmp_path: Path) -> None:
    add_process(tmp_path, 300, start=5000)
    table = ProcessTable(str(tmp_path))
    assert table.alive(300, 5000) is True
    remove_process(tmp_path, 300)
    assert table.alive(300, 5000) is False
    add_process(tmp_path, 300, start=9000)  # the pid reused by a newer process: still gone
    assert table.alive(300, 5000) is False


def test_a_containers_process_is_found_by_start_time_and_namespace_pid(tmp_path: Path) -> None:
    add_process(tmp_path, 7, start=100)  # the host's pid 7 is someone else
    add_process(tmp_path, 81234, start=4242, namespace_pid=7)
    add_process(tmp_path, 81235, start=4242, namespace_pid=8)  # started in the same tick, another pid
    table = ProcessTable(str(tmp_path))
    assert table.alive(7, 4242) is True
    remove_process(tmp_path, 81234)
    assert table.alive(7, 4242) is False


def test_a_process_never_seen_is_unknown_and_looked_for_again_later(tmp_path: Path) -> None:
    clock = Clock()
    table = ProcessTable(str(tmp_path), clock)
    assert table.alive(55, 1234) is None  # another PID namespace this daemon cannot see
    add_process(tmp_path, 90055, start=1234, namespace_pid=55)
    assert table.alive(55, 1234) is None  # not looked for again yet
    clock.now += RESCAN_AFTER
    assert table.alive(55, 1234) is True


def test_odd_procfs_content_is_unknown_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "stat").write_text("garbage")
    (tmp_path / "self").mkdir()
    assert ProcessTable(str(tmp_path)).alive(12, 1) is None
    assert ProcessTable(str(tmp_path / "missing")).alive(12, 1) is None


def test_this_very_process_through_the_real_proc() -> None:
    start = process_start_time()
    assert start is not None
    assert ProcessTable("/proc").alive(os.getpid(), start) is True
    assert ProcessTable("/proc").alive(os.getpid(), start + 1) in (None, False)


def test_forget_drops_processes_no_rank_reports(tmp_path: Path) -> None:
    add_process(tmp_path, 300, start=5000)
    table = ProcessTable(str(tmp_path))
    assert table.alive(300, 5000) is True
    table.forget(set())
    remove_process(tmp_path, 300)
    assert table.alive(300, 5000) is None  # forgotten: no longer known to have been seen


def test_a_zombie_its_parent_has_not_reaped_is_gone(tmp_path: Path) -> None:
    add_process(tmp_path, 300, start=5000)
    table = ProcessTable(str(tmp_path))
    assert table.alive(300, 5000) is True
    stat = tmp_path / "300" / "stat"
    stat.write_text(stat.read_text().replace(") S ", ") Z "))  # killed; its launcher has not waited for it yet
    assert table.alive(300, 5000) is False
