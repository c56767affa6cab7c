"""The rank's timeline: the phase it is in, the time its open step has collected, and device events.

Every way of timing a step writes through one :class:`Timeline` (``tracker.timeline``): the
tracker's own ``step()``, ``phase()``, ``loader()``/``steps()`` and ``add()``, ``watch()``'s
collective timing (:mod:`fleetscope.client.distributed`), and the Hugging Face and Lightning
callbacks. It offers four things:

* :meth:`Timeline.enter` and :meth:`Timeline.leave`: the rank is in a phase from now (or from a
  moment the caller noted) until it leaves it; leaving books the time to the phase's field;
* :meth:`Timeline.book`: a duration measured elsewhere, booked to a phase;
* :meth:`Timeline.begin_step` and :meth:`Timeline.end_step`: the step's edges;
* device events: :meth:`Timeline.use_device` attaches a *marker* (a function that records an event
  on the rank's current device stream and returns it: ``torch.cuda.Event``'s ``record``,
  ``query`` and ``elapsed_time``, or the test double's); a phase timed on the device then books the
  events' elapsed time, read once they completed, never by waiting for the device.

The training thread writes; the sender thread only reads :meth:`Timeline.position`, which the
training thread updates by replacing one attribute per phase change.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from fleetscope import record

# Phases whose time a step's record carries, by the record field that carries it.
PHASES = {name: f"{name}_seconds" for name in ("data", "compute", "comm")}
assert set(PHASES.values()) <= set(record.names(record.Role.DURATION, record.STEP_FIELDS))
_DATA, _COMPUTE, _COMM = PHASES["data"], PHASES["compute"], PHASES["comm"]
MAX_PENDING_DEVICE = 64  # steps awaiting device events before their host-clock times are used instead
DEVICE_TIMED = frozenset({"comm"})  # phases a device's events time, where the rank has a device
_BOOKED = {name: field for name, field in PHASES.items() if name != "compute"}  # compute is the rest

Position = tuple[int, str, float]  # (step, phase, since on the perf_counter clock)


class DeviceEvent(Protocol):
    """What the timeline needs of a recorded device event (``torch.cuda.Event`` has it)."""

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any, /) -> float: ...  # milliseconds


Marker = Callable[[], DeviceEvent]  # records an event now on the rank's current stream


class Mark:
    """A phase the rank entered (what :meth:`Timeline.enter` returns and :meth:`Timeline.leave` takes)."""

    __slots__ = ("event", "field", "phase", "saved", "started")

    def __init__(self, phase: str, field: str | None, saved: str, started: float, event: DeviceEvent | None) -> None:
        self.phase = phase  # the position's phase while in it
        self.field = field  # the record field its time goes to (None: the step's compute, the rest)
        self.saved = saved  # the position's phase before it
        self.started = started
        self.event = event  # the device event at its start, where it is timed on the device


class Collected:
    """The time a step has collected so far (also what is carried to the next step between steps)."""

    __slots__ = ("compute_added", "events", "seconds", "wall")

    def __init__(self) -> None:
        self.wall = 0.0  # phases timed outside the step, counted in its wall time
        self.seconds: dict[str, float] = {}
        self.events: list[tuple[str, DeviceEvent, DeviceEvent, float]] = []  # (field, start, end, host seconds)
        self.compute_added = False


class Timeline:
    def __init__(self, deliver: Callable[[dict[str, Any]], None], on_error: Callable[[Exception], None]) -> None:
        self._deliver = deliver  # takes a finished step's record
        self._on_error = on_error  # counts an error that must not reach the training loop
        self.next_step = 1
        self._current: Collected | None = None  # the open step's
        self._carry = Collected()  # time collected before the next step opens
        self._depth = 0  # phases open now
        # Written by the training thread, read by the sender's. ``since`` is on the perf_counter clock (no
        # wall-clock read on the training thread); position() converts it.
        self._position: Position = (1, "idle", time.perf_counter())
        self._marker: Marker | None = None
        self._device_wait: tuple[DeviceEvent, float] | None = None  # (end event, start) of a device wait
        self._pending: deque[tuple[dict[str, Any], Collected]] = deque()  # steps awaiting device events

    # -- where the rank is ------------------------------------------------------------------------

    def position(self) -> dict[str, Any]:
        """Where the rank is now: the step it is in, its phase and since when (Unix time)."""
        step, phase, since = self._position
        device_wait = self._device_wait
        if device_wait is not None and phase in ("compute", "other"):
            end, started = device_wait
            try:
                waiting = not end.query()  # a thread-safe, non-blocking look at the device
            except Exception:
                waiting = False
            if waiting:  # the host ran ahead; the device still waits in a collective
                phase, since = "comm", min(since, started)
        return {"step": step, "phase": phase, "since": time.time() - (time.perf_counter() - since)}

    @property
    def step(self) -> int:
        """The step the rank is in (the next one when between steps)."""
        return self._position[0]

    def now_in(self, phase: str, step: int | None = None) -> None:
        """The rank is in ``phase`` (of :data:`fleetscope.record.PHASES`) from now; nothing is timed."""
        if phase not in record.PHASES or phase == "ended":
            raise ValueError(f"unknown phase {phase!r}")
        self._position = (step if step is not None else self._position[0], phase, time.perf_counter())

    # -- phases -----------------------------------------------------------------------------------

    def enter(self, phase: str, since: float | None = None) -> Mark:
        """The rank is in ``phase`` from now, or from ``since`` (a ``time.perf_counter()`` reading).

        ``data`` and ``comm`` are booked as such when left; ``compute`` and other names only say where the
        rank is (their time is the step's compute, the rest of the step). Leave it with :meth:`leave`.
        """
        started = time.perf_counter() if since is None else since
        step, saved, _ = self._position
        event = self.mark() if self._marker is not None and phase in DEVICE_TIMED else None
        self._position = (step, phase if phase in PHASES else "other", started)
        self._depth += 1
        return Mark(phase, _BOOKED.get(phase), saved, started, event)

    def leave(self, mark: Mark) -> float:
        """Back to the phase before ``mark``'s; books its time (host seconds, or its device events). Returns the
        host seconds."""
        now = time.perf_counter()
        elapsed = now - mark.started
        self._depth -= 1
        self._position = (self._position[0], mark.saved, now)
        target = self._current or self._carry
        if self._current is None and self._depth == 0:
            target.wall += elapsed  # outside a step: part of the next step's wall time
        end = self.mark() if mark.event is not None else None
        if mark.field is None:
            pass
        elif mark.event is not None and end is not None:
            target.events.append((mark.field, mark.event, end, elapsed))
            self._device_wait = (end, mark.started)
        else:
            target.seconds[mark.field] = target.seconds.get(mark.field, 0.0) + elapsed
        return elapsed

    def book(self, phase: str, seconds: float, *, before_step: bool = False) -> None:
        """Book ``seconds`` measured elsewhere to ``phase`` (``data``, ``compute`` or ``comm``) of the open step,
        or of the next one when none is open. ``before_step``: the time passed outside the step (a framework's
        batch fetch) and counts in the next step's wall time too. Booked ``compute`` replaces "the rest"."""
        field = PHASES[phase]
        if before_step and self._current is None and seconds > 0:
            self._carry.wall += seconds
        target = self._current or self._carry
        target.seconds[field] = target.seconds.get(field, 0.0) + seconds
        if field == _COMPUTE:
            target.compute_added = True

    # -- device events ----------------------------------------------------------------------------

    def use_device(self, marker: Marker | None) -> None:
        """Time device work with events ``marker`` records (None: the host clock only)."""
        self._marker = marker

    @property
    def on_device(self) -> bool:
        return self._marker is not None

    def mark(self) -> DeviceEvent | None:
        """An event recorded now on the rank's current device stream (None without a device, or if recording
        failed: the host clock times that phase instead)."""
        if self._marker is None:
            return None
        try:
            return self._marker()
        except Exception as exc:
            self._on_error(exc)
            return None

    def book_device(self, phase: str, start: DeviceEvent, end: DeviceEvent, host_seconds: float) -> None:
        """Book the device time between two recorded events to ``phase`` once they completed
        (``host_seconds`` when they do not in time)."""
        target = self._current or self._carry
        target.events.append((PHASES[phase], start, end, host_seconds))

    # -- steps ------------------------------------------------------------------------------------

    def begin_step(self, number: int | None = None) -> tuple[int, float]:
        """Open a step (numbered ``next_step`` unless given); returns its number and start."""
        if number is None:
            number = self.next_step
        self._current, self._carry = self._carry, Collected()
        started = time.perf_counter()
        self._position = (number, "compute", started)
        return number, started

    def end_step(self, number: int, started: float, fields: dict[str, Any] | None) -> None:
        """Close the open step; ``fields`` (tokens, samples, loss) None: it failed and is not reported."""
        now = time.perf_counter()
        collected = self._current or Collected()
        self._current = None
        self._position = (number + 1, "idle", now)
        self.next_step = number + 1
        if fields is None:
            return  # a failed step is not a step
        entry: dict[str, Any] = {"step": number, "step_seconds": now - started + collected.wall,
                                 "timestamp": time.time()}
        entry.update(collected.seconds)
        entry.update(fields)
        if collected.events or self._pending:  # in order: behind steps awaiting their events
            self._pending.append((entry, collected))
        else:
            self._deliver(_with_compute(entry, collected))
        if self._pending:
            self.resolve(force=len(self._pending) > MAX_PENDING_DEVICE)

    def reported(self, number: int) -> None:
        """A step the caller timed itself was reported: the rank is between steps."""
        self.next_step = number + 1
        self._position = (number + 1, "idle", time.perf_counter())

    def resolve(self, force: bool = False) -> None:
        """Deliver steps whose device events completed (never waits on the device); ``force``: the oldest
        step goes with its host-clock times if its events have not."""
        while self._pending:
            entry, collected = self._pending[0]
            try:
                done = all(end.query() for _, _, end, _ in collected.events)
                if not done and not force:
                    return
                # Too far behind: the host clock's measure rather than hold more records.
                values = [(field, start.elapsed_time(end) / 1000.0 if done else host_seconds)
                          for field, start, end, host_seconds in collected.events]
            except Exception as exc:  # a device error: the host clock's measure
                self._on_error(exc)
                values = [(field, host_seconds) for field, _, _, host_seconds in collected.events]
            for field, value in values:
                entry[field] = entry.get(field, 0.0) + value
            self._pending.popleft()
            self._deliver(_with_compute(entry, collected))
            force = False

    def flush(self) -> None:
        """Deliver every step still awaiting device events (with host-clock times where they have not
        completed)."""
        while self._pending:
            self.resolve(force=True)

    @property
    def depth(self) -> int:
        """Phases open now."""
        return self._depth


def _with_compute(entry: dict[str, Any], collected: Collected) -> dict[str, Any]:
    """The step's compute: what was booked as such, or the rest of the step after data and comm."""
    if not collected.compute_added:
        rest = entry["step_seconds"] - entry.get(_DATA, 0.0) - entry.get(_COMM, 0.0)
        entry[_COMPUTE] = max(0.0, rest)
    return entry
