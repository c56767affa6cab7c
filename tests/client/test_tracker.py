from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetscope.client import StepTracker
from fleetscope.push.store import RankView
from fleetscope_sim.harness import eventually
from tests.push.live import LiveDaemon, running_daemon


def rank_view(daemon: LiveDaemon, job: str, rank: int = 0) -> RankView:
    (view,) = [r for r in daemon.collector.store.view().ranks if (r.job, r.rank) == (job, rank)]
    return view


def position_of(daemon: LiveDaemon, job: str, rank: int = 0) -> Any:
    views = [r for r in daemon.collector.store.view().ranks if (r.job, r.rank) == (job, rank)]
    return views[0].position if views else None


HANG = 240.0  # seconds: guards a hang only (inside pytest-timeout's 300), never a verdict on speed


def wait_for(condition: Any, timeout: float = HANG) -> bool:
    """``condition`` came true: returns as soon as it does; ``timeout`` is raised to HANG (a hang guard)."""
    return bool(eventually(condition, max(timeout, HANG), interval=0.02))


class FakeScalar:
    """Something with .item(), as a 0-d tensor or numpy scalar has."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


class Captured(StepTracker):
    """A tracker whose records stay in memory (no daemon needed)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(job="mem", rank=0, url="http://127.0.0.1:9", environ={}, flush_interval=3600, **kwargs)
        self.entries: list[dict[str, Any]] = []
        self.sender.put = self.entries.append  # type: ignore[method-assign]


def test_steps_and_phases_are_timed_and_pushed() -> None:
    with running_daemon() as daemon:
        tracker = StepTracker(job="loop", rank=3, local_rank=1, pp_stage=0, url=daemon.url, environ={})
        for _ in range(4):
            with tracker.step(tokens=100, samples=2) as step:
                with tracker.phase("data"):
                    time.sleep(0.002)
                with tracker.phase("compute"):
                    time.sleep(0.004)
                with tracker.phase("comm"):
                    time.sleep(0.001)
                with tracker.phase("logging"):  # a phase of the user's naming: the rank's own work
                    time.sleep(0.001)
                step.loss = FakeScalar(0.5)
        tracker.close()
        view = rank_view(daemon, "loop", 3)
    values = view.values
    assert values["steps"] == 4 and values["step"] == 4
    assert (view.fields["local_rank"], view.fields["pp_stage"]) == (1, 0)
    assert values["data_seconds"] >= 4 * 0.002 and values["comm_seconds"] >= 4 * 0.001
    assert values["compute_seconds"] >= 4 * 0.005  # compute and logging: what is left of each step
    parts = values["data_seconds"] + values["compute_seconds"] + values["comm_seconds"]
    assert parts == pytest.approx(values["step_seconds"])
    assert values["tokens"] == 400 and values["samples"] == 8 and values["loss"] == 0.5
    assert view.process == (os.getpid(), view.fields["start_time"]) and view.fields["start_time"] > 0


def test_compute_is_the_rest_of_the_step_unless_added() -> None:
    tracker = Captured()
    with tracker.step():
        time.sleep(0.01)
        tracker.add("comm", 0.004)
    with tracker.step():
        tracker.add("compute", 0.5)  # measured elsewhere (CUDA events, a profiler): taken as given
        tracker.add("data", 0.25)
    tracker.add("data", float("nan"))  # refused and counted, never raised
    tracker.add("lunch", 1.0)
    tracker.close(timeout=0.1)
    first, second = tracker.entries
    assert first["comm_seconds"] == 0.004
    assert first["compute_seconds"] == pytest.approx(first["step_seconds"] - 0.004)
    assert "data_seconds" not in first  # never timed: absent, not zero
    assert (second["compute_seconds"], second["data_seconds"]) == (0.5, 0.25)
    assert tracker.errors == 2


def test_phase_before_the_step_counts_toward_it() -> None:
    tracker = Captured()
    with tracker.phase("data"):
        time.sleep(0.01)
    with tracker.step():
        pass
    with tracker.step():
        pass
    tracker.close(timeout=0.1)
    first, second = tracker.entries
    assert first["data_seconds"] >= 0.01 and first["step_seconds"] >= first["data_seconds"]
    assert "data_seconds" not in second


def test_failed_step_is_not_reported_and_its_exception_propagates() -> None:
    with running_daemon() as daemon:
        tracker = StepTracker(job="oom", rank=0, url=daemon.url, environ={})
        with pytest.raises(RuntimeError), tracker.step():
            raise RuntimeError("CUDA out of memory")
        with tracker.step(step=10):
            pass
        tracker.report(0.25)
        tracker.close()
        view = rank_view(daemon, "oom")
    assert view.values["steps"] == 2 and view.values["step"] == 11  # numbering continues after an explicit step


def test_report_with_own_timings() -> None:
    with running_daemon() as daemon:
        with StepTracker(job="manual", rank=1, url=daemon.url, environ={}) as tracker:
            tracker.report(
                1.0,
                step=7,
                data_seconds=0.1,
                compute_seconds=0.7,
                comm_seconds=0.2,
                tokens=FakeScalar(64),
                loss=2.0,
                timestamp=1_700_000_000.0,
            )
        view = rank_view(daemon, "manual", 1)
    values = view.values
    assert [values[f"{name}_seconds"] for name in ("step", "data", "compute", "comm")] == [1.0, 0.1, 0.7, 0.2]
    assert (values["tokens"], values["loss"]) == (64, 2.0)
    # The daemon keeps instants on its monotonic clock and exports them as wall time again (#30 item 4). The two
    # clocks' offset is read at the push and again at the scrape, each a pair of calls a loaded machine may part
    # by milliseconds; an instant left on the monotonic clock would be off by the machine's uptime.
    assert values["timestamp"] == pytest.approx(1_700_000_000.0, abs=0.5)


def test_report_never_raises_on_garbage() -> None:
    tracker = StepTracker(job="garbage", rank=0, url="http://127.0.0.1:9", environ={}, flush_interval=60)
    tracker.report(object())  # type: ignore[arg-type]
    tracker.report(1.0, tokens=FakeScalar)  # type: ignore[arg-type]  # .item is not callable without self
    tracker.close(timeout=5)
    assert tracker.errors == 1  # the second call failed inside report() and was counted
    stats = tracker.stats()
    assert (stats.enqueued, stats.rejected, stats.sent) == (1, 1, 0)  # the first could not be encoded


def test_environment_fills_in_job_rank_url_and_gpu() -> None:
    with running_daemon() as daemon:
        env = {
            "SLURM_JOB_ID": "4242",
            "SLURM_PROCID": "6",
            "SLURM_LOCALID": "2",
            "SLURM_NTASKS": "8",
            "FLEETSCOPE_PUSH_URL": daemon.url,
            "CUDA_VISIBLE_DEVICES": "4,5,6,7",
        }
        tracker = StepTracker(environ=env)
        tracker.report(0.5)
        tracker.close()
        view = rank_view(daemon, "4242", 6)
    assert (view.fields["local_rank"], view.fields["world_size"], view.fields["gpu"]) == (2, 8, "6")


# -- the loader wrapper ---------------------------------------------------------------------------


class SlowLoader:
    """Yields ``count`` batches, each after ``delay`` seconds; has set_epoch like a sampler-aware loader."""

    def __init__(self, count: int, delay: float) -> None:
        self.count, self.delay, self.epoch = count, delay, -1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        for i in range(self.count):
            time.sleep(self.delay)
            yield i


def test_loader_books_each_fetch_as_data_and_stands_in_for_the_loader() -> None:
    tracker = Captured()
    loader = tracker.loader(SlowLoader(3, 0.01))
    assert len(loader) == 3  # type: ignore[arg-type]
    seen = []
    for epoch in range(2):
        loader.set_epoch(epoch)  # type: ignore[attr-defined]
        for batch in loader:
            with tracker.step():
                seen.append(batch)
    tracker.close(timeout=0.1)
    assert seen == [0, 1, 2, 0, 1, 2] and loader.epoch == 1  # type: ignore[attr-defined]
    assert len(tracker.entries) == 6
    for entry in tracker.entries:
        assert entry["data_seconds"] >= 0.01 and entry["step_seconds"] >= entry["data_seconds"]


def test_steps_makes_each_batch_one_step_from_its_fetch_to_the_next() -> None:
    torch = pytest.importorskip("torch")
    tracker = Captured()
    batches = [torch.zeros(8, 3), torch.zeros(8, 3), torch.zeros(5, 3)]

    def slowly() -> Iterator[Any]:
        for batch in batches:
            time.sleep(0.01)
            yield batch

    for index, _ in enumerate(tracker.steps(slowly())):
        assert tracker.position()["phase"] == "compute" and tracker.position()["step"] == index + 1
        time.sleep(0.005)
    for _batch in tracker.steps([{"x": torch.zeros(2, 1)}, {"x": torch.zeros(2, 1)}]):
        break  # leaving the loop ends the step in flight
    tracker.close(timeout=0.1)
    assert [e["samples"] for e in tracker.entries] == [8, 8, 5, 2]
    for entry in tracker.entries[:3]:
        assert entry["data_seconds"] >= 0.01 and entry["compute_seconds"] >= 0.005
        assert entry["step_seconds"] == pytest.approx(entry["data_seconds"] + entry["compute_seconds"])
    assert tracker.position()["phase"] == "idle"


def test_loader_survives_a_break_and_an_error_in_the_loader() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise OSError("shard missing")

    tracker = Captured()
    for batch in tracker.loader(SlowLoader(5, 0.0)):
        with tracker.step():
            pass
        if batch == 1:
            break  # the loader's generator is closed inside no phase
    def train_on_failing_loader() -> None:
        for _ in tracker.loader(failing()):
            with tracker.step():
                pass

    with pytest.raises(OSError, match="shard missing"):
        train_on_failing_loader()
    with tracker.step():
        pass
    tracker.close(timeout=0.1)
    assert tracker.timeline.depth == 0 and len(tracker.entries) == 4


def test_loader_with_a_multi_worker_dataloader() -> None:
    torch = pytest.importorskip("torch")
    dataset = torch.utils.data.TensorDataset(torch.arange(32.0))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2)
    with running_daemon() as daemon:
        tracker = StepTracker(job="workers", rank=0, url=daemon.url, environ={})
        total = 0.0
        for (batch,) in tracker.loader(loader):
            with tracker.step(samples=len(batch)):
                total += float(batch.sum())
        tracker.close()
        view = rank_view(daemon, "workers")
    assert total == sum(range(32))
    assert view.values["steps"] == 8 and view.values["samples"] == 32
    assert 0 < view.values["data_seconds"] <= view.values["step_seconds"]
    assert view.position is not None and view.position.phase == "ended"  # the workers said nothing


# -- positions (the heartbeat) --------------------------------------------------------------------


def test_position_is_reported_while_the_training_thread_is_stuck() -> None:
    with running_daemon() as daemon:
        tracker = StepTracker(job="stuck", rank=0, url=daemon.url, environ={}, flush_interval=0.1)
        release = threading.Event()

        def train() -> None:
            with tracker.step():
                pass
            with tracker.step(), tracker.phase("data"):
                release.wait(HANG)  # a loader that never answers

        thread = threading.Thread(target=train)
        entered = time.time()
        thread.start()

        def in_data() -> bool:
            position = position_of(daemon, "stuck")
            return position is not None and position.phase == "data"

        assert wait_for(in_data, 10)
        first_push = rank_view(daemon, "stuck").values["last_push"]
        assert wait_for(lambda: rank_view(daemon, "stuck").values["last_push"] > first_push + 0.2, 10)
        position = rank_view(daemon, "stuck").position
        assert position is not None and position.step == 2 and entered <= position.since <= time.time()
        release.set()
        thread.join(10)
        tracker.close()
        final = rank_view(daemon, "stuck")
    assert final.position is not None and final.position.phase == "ended"
    assert final.values["steps"] == 2


def test_positions_step_through_phases_on_the_training_thread_only_by_attribute() -> None:
    tracker = Captured()
    assert tracker.position()["phase"] == "idle" and tracker.position()["step"] == 1
    with tracker.step():
        assert tracker.position()["phase"] == "compute"
        with tracker.phase("comm"):
            assert tracker.position()["phase"] == "comm"
        with tracker.phase("checkpoint"):
            assert tracker.position()["phase"] == "other"
        assert tracker.position()["phase"] == "compute"
    after = tracker.position()
    assert (after["step"], after["phase"]) == (2, "idle") and after["since"] <= time.time()
    tracker.close(timeout=0.1)


def test_a_loop_that_times_itself_says_where_it_is() -> None:
    tracker = Captured()
    tracker.report(1.0)
    assert tracker.position()["phase"] == "idle" and tracker.position()["step"] == 2
    tracker.now_in("comm")
    assert (tracker.position()["phase"], tracker.position()["step"]) == ("comm", 2)
    tracker.now_in("data", step=7)
    assert (tracker.position()["phase"], tracker.position()["step"]) == ("data", 7)
    tracker.now_in("lunch")  # refused and counted, never raised
    assert tracker.position()["phase"] == "data" and tracker.errors == 1
    tracker.close(timeout=0.1)


class Event:
    """A device event the test completes by hand (``at``: its time on the device)."""

    def __init__(self, at: float = 0.0) -> None:
        self.at, self.done = at, False

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: Event) -> float:
        return (end.at - self.at) * 1000.0


def test_a_device_still_waiting_in_a_collective_reports_comm() -> None:
    events: list[Event] = []

    def marker() -> Event:  # the device seam watch() attaches for a model on a GPU
        events.append(Event())
        return events[-1]

    tracker = Captured()
    tracker.timeline.use_device(marker)
    with tracker.step():
        mark = tracker.timeline.enter("comm", since=time.perf_counter() - 5)  # as watch() times an NCCL wait
        tracker.timeline.leave(mark)  # the host ran ahead: the launch returned at once
        assert tracker.position()["phase"] == "idle"  # the device has not even reached the step's start
        events[0].done = True
        assert tracker.position()["phase"] == "compute"  # ... it has, but not the collective
        for event in events[:-1]:
            event.done = True  # ... now it has, and waits in it
        position = tracker.position()
        assert position["phase"] == "comm" and position["since"] <= time.time() - 5
        events[-1].done = True
        assert tracker.position()["phase"] == "compute"
    tracker.close(timeout=0.1)


def test_device_times_are_pushed_once_their_events_complete() -> None:
    tracker = Captured()
    start, end = Event(0.0), Event(0.25)
    with tracker.step():
        tracker.timeline.book_device("comm", start, end, host_seconds=0.001)
    with tracker.step():
        pass
    assert tracker.entries == []  # waiting for the device, without asking it to synchronise
    end.done = True
    with tracker.step():
        pass
    tracker.close(timeout=0.1)
    assert [e["step"] for e in tracker.entries] == [1, 2, 3]
    assert tracker.entries[0]["comm_seconds"] == 0.25
    assert tracker.entries[0]["compute_seconds"] == max(0.0, tracker.entries[0]["step_seconds"] - 0.25)


FORKED_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from fleetscope.client import StepTracker

    tracker = StepTracker(job="fork", rank=0, url=sys.argv[1], environ={}, flush_interval=0.1)
    with tracker.step():
        pass
    pid = os.fork()
    if pid == 0:  # a DataLoader-style worker that exits through the interpreter (atexit runs)
        sys.exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.5)
    with tracker.step():
        pass
    print("alive", flush=True)
    sys.stdin.readline()  # the test looks at the daemon before this process ends
    """
)


def test_a_forked_child_never_speaks_for_the_rank() -> None:
    with running_daemon() as daemon:
        proc = subprocess.Popen(
            [sys.executable, "-c", FORKED_CHILD, daemon.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "alive"
            assert wait_for(lambda: rank_view(daemon, "fork").values["steps"] == 2, 10)
            time.sleep(0.3)  # a few more reports
            view = rank_view(daemon, "fork")
            assert view.position is not None and view.position.phase == "idle"  # not "ended" by the child
            assert daemon.collector.store.view().rejected == {}
        finally:
            if proc.stdin is not None:
                proc.stdin.write("\n")
                proc.stdin.close()
            proc.wait(30)
        assert wait_for(lambda: position_of(daemon, "fork").phase == "ended", 10)


def test_steps_whose_device_never_completes_go_with_the_hosts_figures_at_close() -> None:
    tracker = Captured()
    tracker.timeline.use_device(Event)  # events the device never reaches (a hung GPU)
    for _ in tracker.steps([1, 2]):
        time.sleep(0.002)
    assert tracker.entries == []  # waiting for the device, never synchronising it
    tracker.close(timeout=0.2)  # waits up to 0.1 s for the device, then the host's clock
    assert [e["step"] for e in tracker.entries] == [1, 2]
    for entry in tracker.entries:
        assert entry["data_seconds"] == entry["fetch_seconds"]
        assert entry["step_seconds"] >= 0.002
        assert entry["step_seconds"] == pytest.approx(entry["data_seconds"] + entry["compute_seconds"])


def test_a_tracker_below_the_ranks_process_stays_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETSCOPE_RANK_PROCESS", f"{os.getpid() + 1}:0:quiet")  # as a spawned worker inherits it
    with running_daemon() as daemon:
        tracker = StepTracker(job="quiet", rank=0, url=daemon.url, environ={}, flush_interval=0.05)
        with tracker.step():
            pass
        time.sleep(0.3)
        tracker.close()
        assert tracker.reporting_process == os.getpid() + 1 and tracker.sender._thread is None
        assert [r for r in daemon.collector.store.view().ranks if r.job == "quiet"] == []  # not even a goodbye
    assert os.environ["FLEETSCOPE_RANK_PROCESS"] == f"{os.getpid() + 1}:0:quiet"  # the rank's claim stands


SPAWNED_WORKERS = textwrap.dedent(
    """
    import os, sys, time
    import torch
    from fleetscope.client import StepTracker

    # At module level, as many training scripts have it: spawn and forkserver workers import this file again.
    tracker = StepTracker(job="spawned", rank=0, url=os.environ["TEST_PUSH_URL"], environ={}, flush_interval=0.05)


    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            time.sleep(0.05)
            return torch.tensor([index])


    if __name__ == "__main__":
        for method in sys.argv[1:]:
            loader = torch.utils.data.DataLoader(Slow(), batch_size=2, num_workers=1, multiprocessing_context=method)
            for epoch in range(2):  # a new worker each epoch
                for batch in tracker.steps(loader):
                    time.sleep(0.02)
        print("trained", flush=True)
        sys.stdin.readline()  # the test reads the daemon before the goodbye
        tracker.close()
    """
)


@pytest.mark.slow
def test_dataloader_workers_started_with_spawn_or_forkserver_never_speak_for_the_rank(tmp_path: Path) -> None:
    """One training process (one torch import, one daemon) runs two epochs with spawn workers, then two with
    forkserver workers: a new worker each epoch, each importing the script's module-level tracker again."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(SPAWNED_WORKERS)
    with running_daemon() as daemon:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
        env.update(TEST_PUSH_URL=daemon.url, PYTHONPATH=os.pathsep.join(sys.path))
        proc = subprocess.Popen([sys.executable, str(script), "spawn", "forkserver"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
        seen: list[tuple[int, str, int]] = []  # (pid, phase, current step) as the daemon had them, in order
        try:
            assert proc.stdout is not None and proc.stdin is not None
            trained = threading.Event()
            threading.Thread(target=lambda: (proc.stdout.readline(), trained.set()), daemon=True).start()  # type: ignore[union-attr]
            deadline = time.monotonic() + HANG  # a hang guard: spawning torch workers takes what it takes
            while not trained.is_set() and time.monotonic() < deadline:
                seen.extend((view.process[0], view.position.phase, view.position.step)
                            for view in daemon.collector.store.view().ranks
                            if view.job == "spawned" and view.position is not None and view.process is not None)
                time.sleep(0.01)
            assert trained.is_set()
            assert wait_for(lambda: any(r.job == "spawned" and r.values["steps"] >= 16  # the last flush arrived
                                        for r in daemon.collector.store.view().ranks))
            view = rank_view(daemon, "spawned")
            assert view.values["steps"] == 16 and view.position is not None and view.position.phase != "ended"
        finally:
            if proc.stdin is not None:
                proc.stdin.write("\n")
                proc.stdin.close()
            proc.wait(60)
    assert seen and {pid for pid, _, _ in seen} == {proc.pid}  # only the rank's own process reported
    assert "ended" not in {phase for _, phase, _ in seen}
    steps = [step for _, _, step in seen]
    assert steps == sorted(steps) and steps[-1] >= 16  # the current step never went back to 1
