"""Step phases as an asynchronous device sees them (#26 items 1 and 2), on the simulated device.

The same client code as on a GPU: ``tracker.timeline.use_device(device.marker)`` is the seam ``watch()``
attaches a CUDA marker to. Each loop is a data-parallel step as a GPU runs it: the host launches forward,
backward, the gradient all-reduce (a kernel on the stream that runs a real gloo all-reduce when the device
reaches it, as NCCL does) and the optimizer, and goes on to fetch the next batch while the device works.
The host is throttled only by the device's launch queue.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fleetscope.client import StepTracker
from fleetscope_sim.device import Device
from tests.client.test_tracker import Captured, position_of, rank_view, wait_for
from tests.push.live import running_daemon

MS = 1e-3
KERNELS = (("forward", 8 * MS), ("backward", 10 * MS), ("optimizer", 2 * MS))  # 20 ms of device work per step


class StallingLoader:
    """``steps`` batches at once, except one that takes ``stall`` seconds of host time (a slow shard, a GC pause).

    Notes, when the stall begins, how much launched work the device still had queued."""

    def __init__(self, steps: int, stall_at: int, stall: float, device: Device) -> None:
        self.steps, self.stall_at, self.stall, self.device = steps, stall_at, stall, device
        self.queued_at_stall = 0.0
        self.stall_window = (0.0, 0.0)

    def __iter__(self) -> Iterator[int]:
        for index in range(self.steps):
            if index == self.stall_at:
                self.queued_at_stall = self.device.queued_seconds()
                begun = time.perf_counter()
                time.sleep(self.stall)
                self.stall_window = (begun, time.perf_counter())
            yield index


def train(tracker: StepTracker, device: Device, batches: Any, all_reduce: Callable[[], Any] | None = None) -> None:
    """The README's loop on the device: every step launches its kernels; nothing reads a value back."""
    for _ in tracker.steps(batches):
        device.launch(KERNELS[0][1], name=KERNELS[0][0])
        device.launch(KERNELS[1][1], name=KERNELS[1][0])
        if all_reduce is not None:
            with tracker.phase("comm"):  # what watch() does around DDP's wait: the timeline's comm phase
                device.launch(0.0, work=all_reduce, name="all_reduce")
        device.launch(KERNELS[2][1], name=KERNELS[2][0])


def stalled_run(stall: float, on_device: bool = True) -> tuple[dict[str, Any], StallingLoader, Device]:
    """One rank, 16 steps, the 11th fetch stalling; returns the 11th step's record."""
    with Device(queue_depth=16) as device:
        tracker = Captured()
        if on_device:
            tracker.timeline.use_device(device.marker)
        loader = StallingLoader(16, stall_at=10, stall=stall, device=device)
        train(tracker, device, loader)
        device.synchronize()
        tracker.close(timeout=2)
    assert [entry["step"] for entry in tracker.entries] == list(range(1, 17))
    return tracker.entries[10], loader, device


def test_a_loader_stall_shorter_than_the_queued_work_costs_the_device_nothing() -> None:
    entry, loader, device = stalled_run(0.025)
    assert loader.queued_at_stall > 0.035  # the host was ahead by more than the stall: the device never starved
    assert entry["fetch_seconds"] >= 0.025  # the loader took 25 ms ...
    assert entry["data_seconds"] < 0.003  # ... and the device did not wait for it
    assert device.idle_seconds(*loader.stall_window) < 0.003  # which is what the device did
    assert entry["compute_seconds"] == pytest.approx(0.020, abs=0.004)  # its 20 ms of work
    assert entry["step_seconds"] == pytest.approx(entry["data_seconds"] + entry["compute_seconds"])


def test_a_loader_stall_longer_than_the_queued_work_idles_the_device_for_the_rest() -> None:
    entry, loader, device = stalled_run(0.120)
    begun, ended = loader.stall_window
    idle = device.idle_seconds(begun, ended + 0.005)  # the device's own record: it idled once the queue ran dry
    assert entry["fetch_seconds"] >= 0.120
    assert entry["data_seconds"] == pytest.approx(idle, abs=0.003)
    assert entry["data_seconds"] == pytest.approx((ended - begun) - loader.queued_at_stall, abs=0.006)
    assert 0.05 < entry["data_seconds"] < entry["fetch_seconds"] - 0.025  # the stall less the queued work
    # The host clock, as before #26, books the whole fetch as the device's wait.
    host_entry, _, _ = stalled_run(0.120, on_device=False)
    assert host_entry["data_seconds"] == host_entry["fetch_seconds"] >= 0.120


def test_without_a_device_data_is_the_hosts_fetch_as_before() -> None:
    tracker = Captured()
    for _ in tracker.steps(StallingLoader(3, stall_at=1, stall=0.01, device=Device())):
        time.sleep(0.002)
    tracker.close(timeout=0.1)
    assert all(entry["data_seconds"] == entry["fetch_seconds"] for entry in tracker.entries)
    assert tracker.entries[1]["data_seconds"] >= 0.01


# -- peers: real gloo all-reduces between ranks (threads of this process, one gloo process group each) -------


def gloo_ranks(
    job: str, url: str, slowdown: dict[int, float], body: Callable[[int, StepTracker, Device, Callable[[], Any]], None]
) -> tuple[list[threading.Thread], dict[int, BaseException]]:
    torch = pytest.importorskip("torch")
    distributed = pytest.importorskip("torch.distributed")
    store = distributed.HashStore()
    failures: dict[int, BaseException] = {}

    def run(rank: int) -> None:
        try:
            group = distributed.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=120))
            gradients = torch.ones(4096)
            with Device(f"gpu{rank}", queue_depth=16, slowdown=slowdown.get(rank, 1.0)) as device:
                tracker = StepTracker(job=job, rank=rank, local_rank=rank, world_size=2, url=url, environ={},
                                      flush_interval=0.1)
                tracker.timeline.use_device(device.marker)
                body(rank, tracker, device, lambda: group.allreduce([gradients]).wait())
                device.synchronize()
                tracker.close(timeout=5)
        except BaseException as exc:  # reported by the test, not lost in a thread
            failures[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,), name=f"rank{rank}") for rank in (0, 1)]
    for thread in threads:
        thread.start()
    return threads, failures


def test_a_gpu_10_percent_slower_is_compute_on_its_rank_and_comm_on_its_peer() -> None:
    steps = 30

    def body(rank: int, tracker: StepTracker, device: Device, all_reduce: Callable[[], Any]) -> None:
        train(tracker, device, range(steps), all_reduce)

    with running_daemon() as daemon:
        threads, failures = gloo_ranks("sim-straggler", daemon.url, {1: 1.1}, body)
        for thread in threads:
            thread.join(60)
        assert failures == {}
        views = {rank: rank_view(daemon, "sim-straggler", rank).values for rank in (0, 1)}
    assert views[0]["steps"] == views[1]["steps"] == steps
    median = {rank: {part: views[rank][f"{part}_seconds_median"] for part in ("step", "compute", "comm", "data")}
              for rank in (0, 1)}
    work = sum(seconds for _, seconds in KERNELS)
    # Rank 1's device takes 2 ms longer per step: its compute, and rank 0's wait in the all-reduce.
    assert median[0]["compute"] == pytest.approx(work, rel=0.05)
    assert median[1]["compute"] == pytest.approx(work * 1.1, rel=0.05)
    assert median[0]["comm"] - median[1]["comm"] == pytest.approx(work * 0.1, abs=0.001)
    assert median[0]["step"] == pytest.approx(median[1]["step"], abs=0.001)  # synchronous: the same step time
    assert median[0]["data"] < 0.001 and median[1]["data"] < 0.001  # the hosts were ahead all along


def test_a_hang_while_the_hosts_are_ahead_names_the_phase_each_device_is_in() -> None:
    hung_step = 5
    released = threading.Event()
    trackers: dict[int, StepTracker] = {}

    def body(rank: int, tracker: StepTracker, device: Device, all_reduce: Callable[[], Any]) -> None:
        trackers[rank] = tracker
        for index in tracker.steps(range(12)):
            device.launch(KERNELS[0][1], name="forward")
            if rank == 1 and index + 1 == hung_step:
                device.hang(until=released)  # rank 1's GPU stops in step 5's forward
            device.launch(KERNELS[1][1], name="backward")
            with tracker.phase("comm"):
                device.launch(0.0, work=all_reduce, name="all_reduce")
            device.launch(KERNELS[2][1], name="optimizer")

    with running_daemon() as daemon:
        threads, failures = gloo_ranks("sim-hang", daemon.url, {}, body)
        try:
            # Both hosts run on past step 5 until their launch queues are full, then block in a launch.
            assert wait_for(lambda: len(trackers) == 2 and all(t.timeline.step > hung_step for t in trackers.values()),
                            10)
            time.sleep(0.5)
            assert failures == {}
            hosts = {rank: tracker.timeline.step for rank, tracker in trackers.items()}
            positions = {rank: tracker.position() for rank, tracker in trackers.items()}
            assert (positions[0]["step"], positions[0]["phase"]) == (hung_step, "comm")  # waits for rank 1
            assert (positions[1]["step"], positions[1]["phase"]) == (hung_step, "compute")  # the hung one
            assert all(host > hung_step for host in hosts.values())

            def reported(rank: int, phase: str) -> bool:  # what the daemon heard from the sender thread
                position = position_of(daemon, "sim-hang", rank)
                return position is not None and (position.step, position.phase) == (hung_step, phase)

            assert wait_for(lambda: reported(0, "comm") and reported(1, "compute"), 10)
        finally:
            released.set()
            for thread in threads:
                thread.join(60)
        assert failures == {}
        for rank in (0, 1):
            assert rank_view(daemon, "sim-hang", rank).values["steps"] == 12  # released: every step reported
