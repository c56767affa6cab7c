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
HANG = 240.0  # seconds: guards a hang only (inside pytest-timeout's 300), never a verdict on speed
KERNELS = (("forward", 8 * MS), ("backward", 10 * MS), ("optimizer", 2 * MS))  # 20 ms of device work per step
# A bound on device time holds up to the float rounding of its timestamps (perf_counter, seconds since boot:
# a few ULPs at 1e4-1e5 s are 1e-11 s; fresh-clone run 58 read 0.01999999998952262 s of 0.02).
ROUNDING = 1e-9


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


def stalled_step_on_the_device(device: Device) -> tuple[float, float]:
    """The device's own record of the stalled (11th) step: (seconds it idled before the step's first kernel,
    seconds from the 10th step's last kernel's end to the 11th's)."""
    busy = list(device.busy)
    assert [name for _, _, name in busy[29:33]] == ["optimizer", "forward", "backward", "optimizer"]
    return busy[30][0] - busy[29][1], busy[32][1] - busy[29][1]


def assert_the_tracker_reports_what_the_device_did(entry: dict[str, Any], device: Device) -> None:
    """The step is the device's step, and its data phase the device's idle time before its work: from the
    device's own record, not the host's clock, whatever the machine's scheduler did to either thread."""
    idle, span = stalled_step_on_the_device(device)
    work = sum(seconds for _, seconds in KERNELS)
    # The step's edges are markers the host records: each completes when the device reaches it, never before
    # the work launched ahead of it, so the step fits in the device's span, its data phase in the device's
    # idle time before the step's first kernel, and its compute holds at least the step's kernels.
    assert entry["step_seconds"] <= span + ROUNDING
    assert entry["data_seconds"] <= idle + ROUNDING
    assert entry["compute_seconds"] >= work - ROUNDING
    assert entry["data_seconds"] + entry["compute_seconds"] == pytest.approx(entry["step_seconds"])


# The figures of the two cases (a 25 ms stall behind 35 ms of queued work costs the device nothing; a 120 ms
# one idles it for the stall less the queued work) depend on the host thread running ahead, which a loaded
# machine decides: they are measured on a real GPU, beside CUPTI's idle time, by benchmarks/device_phases.py.
# Here: whatever the timing, the tracker reports the device's record, and without a device the host's fetch.


def test_a_loader_stall_shorter_than_the_queued_work_is_booked_as_the_device_saw_it() -> None:
    entry, _, device = stalled_run(0.025)
    assert entry["fetch_seconds"] >= 0.025  # the loader took 25 ms ...
    assert_the_tracker_reports_what_the_device_did(entry, device)  # ... and data is what the device idled


def test_a_loader_stall_longer_than_the_queued_work_is_booked_as_the_device_saw_it() -> None:
    entry, _, device = stalled_run(0.120)
    assert entry["fetch_seconds"] >= 0.120
    assert_the_tracker_reports_what_the_device_did(entry, device)
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
            group = distributed.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=HANG))
            gradients = torch.ones(4096)
            with Device(f"gpu{rank}", queue_depth=16, slowdown=slowdown.get(rank, 1.0)) as device:
                tracker = StepTracker(job=job, rank=rank, local_rank=rank, world_size=2, url=url, environ={},
                                      flush_interval=0.1)
                tracker.timeline.use_device(device.marker)
                body(rank, tracker, device, lambda: group.allreduce([gradients]).wait())
                device.synchronize()
                tracker.close(timeout=HANG)  # every event completed (synchronized): returns at once
        except BaseException as exc:  # reported by the test, not lost in a thread
            failures[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,), name=f"rank{rank}") for rank in (0, 1)]
    for thread in threads:
        thread.start()
    return threads, failures


LATE = 0.020  # seconds rank 1's device works on after its peer's device reached the step's all-reduce


def test_a_slower_gpu_is_compute_on_its_rank_and_comm_on_its_peer() -> None:
    """Rank 1's device ends each step's work LATE after rank 0's device reached the all-reduce: a GPU behind
    its peer by construction (events, not timings), so rank 0 waits at least LATE in every all-reduce, whatever
    the machine's load, and rank 1 computes at least LATE more than its kernels."""
    steps = 30
    reached = [threading.Event() for _ in range(steps)]  # rank 0's device entered step n's all-reduce

    def body(rank: int, tracker: StepTracker, device: Device, all_reduce: Callable[[], Any]) -> None:
        for index in tracker.steps(range(steps)):
            device.launch(KERNELS[0][1], name=KERNELS[0][0])
            device.launch(KERNELS[1][1], name=KERNELS[1][0])
            if rank == 1:
                device.launch(0.0, work=lambda n=index: (reached[n].wait(HANG), time.sleep(LATE)), name="behind")
            entered = (lambda n=index: (reached[n].set(), all_reduce())) if rank == 0 else all_reduce
            with tracker.phase("comm"):  # what watch() does around DDP's wait: the timeline's comm phase
                device.launch(0.0, work=entered, name="all_reduce")
            device.launch(KERNELS[2][1], name=KERNELS[2][0])

    with running_daemon() as daemon:
        threads, failures = gloo_ranks("sim-straggler", daemon.url, {}, body)
        for thread in threads:
            thread.join(HANG)
        assert failures == {}
        views = {rank: rank_view(daemon, "sim-straggler", rank).values for rank in (0, 1)}
    assert views[0]["steps"] == views[1]["steps"] == steps
    work = sum(seconds for _, seconds in KERNELS)
    # The device's own times (markers complete when the device reaches them): rank 0 waited in each
    # all-reduce until rank 1's device arrived, LATE after it; that shows as rank 0's comm and rank 1's compute.
    assert views[0]["comm_seconds_median"] >= LATE - ROUNDING
    assert views[1]["compute_seconds_median"] >= work + LATE - ROUNDING
    assert views[0]["compute_seconds_median"] >= work - ROUNDING


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

            def where() -> dict[int, tuple[int, str]]:
                return {rank: (tracker.position()["step"], tracker.position()["phase"])
                        for rank, tracker in trackers.items()}

            # The devices get there in their own time (a loaded machine wakes their threads late): waited for,
            # and then they stay there, hung, however long one looks.
            expected = {0: (hung_step, "comm"), 1: (hung_step, "compute")}  # rank 0 waits for rank 1, the hung one
            assert wait_for(lambda: where() == expected), where()
            assert failures == {}
            hosts = {rank: tracker.timeline.step for rank, tracker in trackers.items()}
            assert all(host > hung_step for host in hosts.values())
            assert where() == expected

            def reported(rank: int, phase: str) -> bool:  # what the daemon heard from the sender thread
                position = position_of(daemon, "sim-hang", rank)
                return position is not None and (position.step, position.phase) == (hung_step, phase)

            assert wait_for(lambda: reported(0, "comm") and reported(1, "compute"), 10)
        finally:
            released.set()
            for thread in threads:
                thread.join(HANG)
        assert failures == {}
        for rank in (0, 1):
            assert rank_view(daemon, "sim-hang", rank).values["steps"] == 12  # released: every step reported
