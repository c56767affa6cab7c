"""The asynchronous device model: the host runs ahead, a full launch queue blocks it, synchronising reads absorb the
device's time, and a slow device shows up on the host at the next read, not where its work was launched."""

from __future__ import annotations

import threading
import time

import pytest

from fleetscope_sim.device import Device

MS = 1e-3


def test_launches_return_at_once_and_the_device_works_after() -> None:
    with Device(queue_depth=64) as device:
        held = device.hang()  # a launch that waited for its kernel would never return while the device is held
        start = device.marker()
        for _ in range(5):
            device.launch(20 * MS)
        end = device.marker()
        assert not end.query()  # the host is ahead: the device has not even begun
        with pytest.raises(RuntimeError):
            start.elapsed_time(end)  # as CUDA: not before both completed
        held.set()
        assert end.synchronize(5)
        # five kernels of 20 ms (more if the host launched them late), less a float sum's rounding (99.99999998)
        assert start.elapsed_time(end) >= 100.0 - 1e-6


def test_the_devices_time_is_its_kernels_not_its_workers_wakeups() -> None:
    with Device(queue_depth=64) as device:
        gate = device.hang()  # everything below is launched before the device starts on it
        start = device.marker()
        for _ in range(5):
            device.launch(20 * MS)
        end = device.marker()
        gate.set()
        assert end.synchronize(5)
        assert start.elapsed_time(end) == pytest.approx(100.0, abs=0.5)  # exactly modelled, on a busy machine too


def test_a_full_launch_queue_blocks_the_host_until_the_device_frees_a_slot() -> None:
    with Device(queue_depth=4) as device:
        launched = time.perf_counter()
        for _ in range(10):
            device.launch(10 * MS)
        host = time.perf_counter() - launched
        # 10 kernels through 4 slots: the host waited for at least 5 of them (one more runs outside the queue)
        assert host >= 5 * 10 * MS * 0.9
        assert device.queued_seconds() <= 5 * 10 * MS + 1e-9
        device.synchronize()
        assert device.queued_seconds() == pytest.approx(0.0, abs=1e-9)


def test_a_synchronising_read_absorbs_the_slow_devices_time() -> None:
    read_seconds = {}
    for slowdown in (1.0, 2.0):
        with Device(slowdown=slowdown) as device:
            held = device.hang()  # launching returns on either device while it has not begun: it costs no device time
            for _ in range(4):
                device.launch(10 * MS)
            after_launch = time.perf_counter()
            held.set()
            assert device.read(7) == 7  # .item(): the value once the work before it is done
            read_seconds[slowdown] = time.perf_counter() - after_launch
    assert read_seconds[1.0] >= 35 * MS and read_seconds[2.0] >= 75 * MS  # the read is where the slow device shows


def test_a_kernels_work_runs_on_the_device_in_stream_order_and_takes_its_time() -> None:
    seen: list[str] = []
    with Device() as device:
        device.launch(5 * MS, name="forward")
        gate = threading.Event()
        device.launch(1 * MS, work=lambda: (seen.append("collective"), gate.wait(5)), name="all_reduce")
        after = device.marker()
        time.sleep(0.05)
        assert seen == ["collective"] and not after.query()  # the collective waits; so does what follows it
        gate.set()
        assert after.synchronize(5)
        names = [name for _, _, name in device.busy]
        assert names == ["forward", "all_reduce"]
        start, end, _ = device.busy[1]
        assert end - start >= 0.04  # the wait is device time in the collective


def test_a_hung_kernel_holds_the_stream_until_released_and_idle_time_is_measured() -> None:
    device = Device(queue_depth=8)
    before = time.perf_counter()
    time.sleep(0.03)  # idle
    release = device.hang()
    marker = device.marker()
    time.sleep(0.05)
    assert not marker.query()
    release.set()
    assert marker.synchronize(5)
    after = time.perf_counter()
    # Idle before the hang (at least the 30 ms slept), busy while it held the stream (the 50 ms slept there).
    assert 0.025 <= device.idle_seconds(before, after) < after - before - 0.01
    device.close()
