"""An asynchronous device: what a GPU does to a training loop's host, for the tests and the simulator.

A :class:`Device` runs one stream on its own worker thread. The host *launches* kernels onto it
(:meth:`Device.launch`: a duration in device seconds, and optionally a function the kernel runs when
it starts, such as a collective that waits for its peers). A launch returns at once, so the host runs
ahead of the device, until the launch queue holds ``queue_depth`` entries: then it blocks until the
device frees a slot, as a CUDA launch queue does. What makes the host wait for the device is a
synchronising read: :meth:`Device.synchronize`, :meth:`Device.read` (``.item()``: a value once the work
before it is done) and :meth:`Event.synchronize`. So the time of slow device work shows up on the host
at the next synchronising read, or at a launch that finds the queue full, never where the work was
launched.

Events have ``torch.cuda.Event``'s surface: :meth:`Event.record` enqueues them (taking a queue slot, as
a CUDA event record does), :meth:`Event.query` says without blocking whether the device reached them,
:meth:`Event.elapsed_time` gives the device milliseconds between two completed ones. :meth:`Device.marker`
is the function fleetscope's client attaches (``tracker.timeline.use_device(device.marker)``), the same
seam as ``watch()``'s CUDA marker, so the client's device code runs unchanged on it.

The device keeps its own clock (``time.perf_counter``): a kernel starts when the previous one ended or
when it was launched, whichever is later, and ends its duration (times ``slowdown``) later, or when its
function returns, if that is later. The worker sleeps until then; if the machine wakes it late, the
device's timeline is not stretched (a real GPU does not wait for the host's scheduler), so the device
times a test asserts on are the modelled ones. ``busy`` keeps the device's recent busy intervals: the
ground truth of when it idled.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

_STOP = object()


class Event:
    """A point in the device's stream (``torch.cuda.Event(enable_timing=True)``'s surface)."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self._done = threading.Event()
        self.at: float | None = None  # device time it completed (perf_counter clock)

    def record(self) -> None:
        """Enqueue the event on the device's stream (blocks while the launch queue is full)."""
        self._device._enqueue(self)

    def query(self) -> bool:
        """Whether the device reached the event (never blocks)."""
        return self._done.is_set()

    def synchronize(self, timeout: float | None = None) -> bool:
        """Block the host until the device reached the event (False: ``timeout`` passed first)."""
        return self._done.wait(timeout)

    def elapsed_time(self, end: Event) -> float:
        """Device milliseconds from this event to ``end``; both must have completed, as CUDA requires."""
        if self.at is None or end.at is None:
            raise RuntimeError("both events must be completed before their elapsed time can be read")
        return (end.at - self.at) * 1000.0

    def _complete(self, at: float) -> None:
        self.at = at
        self._done.set()


class _Kernel:
    __slots__ = ("name", "seconds", "work")

    def __init__(self, seconds: float, work: Callable[[], Any] | None, name: str) -> None:
        self.seconds = seconds
        self.work = work
        self.name = name


class Device:
    """One simulated GPU with one stream (see the module's docstring)."""

    def __init__(self, name: str = "sim0", queue_depth: int = 64, slowdown: float = 1.0, busy_log: int = 4096) -> None:
        self.name = name
        self.slowdown = slowdown
        self.queue_depth = queue_depth
        self._queue: queue.Queue[tuple[Any, float]] = queue.Queue(maxsize=queue_depth)
        self._lock = threading.Lock()
        self._free_at = 0.0  # device time the last item scheduled ends
        self._queued_seconds = 0.0  # device seconds of kernels launched and not yet finished
        self.busy: deque[tuple[float, float, str]] = deque(maxlen=busy_log)  # (start, end, kernel name)
        self._hangs: list[threading.Event] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"device-{name}", daemon=True)
        self._thread.start()

    # -- the host's side --------------------------------------------------------------------------

    def launch(self, seconds: float, work: Callable[[], Any] | None = None, name: str = "kernel") -> None:
        """Launch a kernel of ``seconds`` device time (times ``slowdown``) that runs ``work`` when it starts."""
        with self._lock:
            self._queued_seconds += seconds * self.slowdown
        self._enqueue(_Kernel(seconds * self.slowdown, work, name))

    def hang(self, until: threading.Event | None = None, name: str = "hung kernel") -> threading.Event:
        """Launch a kernel that never ends until ``until`` (returned; a new one if not given) is set: a hung GPU.
        :meth:`close` sets it."""
        release = until if until is not None else threading.Event()
        self._hangs.append(release)
        self.launch(0.0, release.wait, name)
        return release

    def marker(self) -> Event:
        """Record an event now on the stream and return it: the client's device seam
        (``tracker.timeline.use_device(device.marker)``)."""
        event = Event(self)
        event.record()
        return event

    def synchronize(self) -> None:
        """Block the host until every launched kernel finished (``torch.cuda.synchronize()``)."""
        self._queue.join()

    def read(self, value: Any = None) -> Any:
        """``tensor.item()``: the value, once the work launched before it finished (a synchronising read)."""
        self.synchronize()
        return value

    def queued_seconds(self) -> float:
        """Device seconds of kernels launched and not yet finished (including the running one, in full)."""
        with self._lock:
            return self._queued_seconds

    def idle_seconds(self, start: float, end: float) -> float:
        """How long the device was idle between two perf_counter times, from its busy log."""
        busy = 0.0
        for begun, ended, _ in list(self.busy):
            busy += max(0.0, min(ended, end) - max(begun, start))
        return max(0.0, (end - start) - busy)

    def close(self, timeout: float = 5.0) -> None:
        """Release any hung kernel, let the stream drain, stop the worker."""
        self._closed = True
        for release in self._hangs:
            release.set()
        try:
            self._queue.put((_STOP, 0.0), timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _enqueue(self, item: Any) -> None:
        self._queue.put((item, time.perf_counter()))  # blocks while the launch queue is full

    # -- the device's side ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item, launched = self._queue.get()
            try:
                if item is _STOP:
                    return
                start = max(self._free_at, launched)
                if isinstance(item, Event):
                    _sleep_until(start)
                    self._free_at = start
                    item._complete(start)
                    continue
                _sleep_until(start)
                if item.work is not None:
                    item.work()  # a collective waiting for peers, a hang: takes the time it takes
                end = max(start + item.seconds, time.perf_counter() if item.work is not None else 0.0)
                _sleep_until(end)
                self._free_at = end
                self.busy.append((start, end, item.name))
                with self._lock:
                    self._queued_seconds -= item.seconds
            finally:
                self._queue.task_done()


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)
