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
  ``query`` and ``elapsed_time``, or the simulated device's, ``fleetscope_sim.device``).

With a marker, events are recorded at every edge that matters (a data or comm phase's start and
end, a step's first edge and its end) and read once complete, never by waiting for the device. A
step then waits (in order) for its events, and goes with the device's view: its wall time from its
first edge to its end, data and comm as the device spent them, compute the rest; the host's time in
data phases stays as ``fetch_seconds``. The same events say where the device is (:meth:`position`).

The training thread writes; the sender thread only reads :meth:`Timeline.position`, which the
training thread updates by replacing one attribute per phase change.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from fleetscope import wire

# Phases whose time a step's record carries, by the record field that carries it.
PHASES = {name: f"{name}_seconds" for name in ("data", "compute", "comm")}
FETCH = "fetch_seconds"  # the host's time in data phases: the loader's latency, whatever the device did meanwhile
assert {*PHASES.values(), FETCH} <= set(wire.names(wire.Role.DURATION, wire.STEP_FIELDS))
_DATA, _COMPUTE, _COMM = PHASES["data"], PHASES["compute"], PHASES["comm"]
_BOOKED = {name: field for name, field in PHASES.items() if name != "compute"}  # compute is the rest
DEVICE_TIMED = frozenset({"data", "comm"})  # phases a device's events time, where the rank has a device
MAX_PENDING_DEVICE = 64  # steps awaiting device events before their host-clock times are used instead
MAX_MARKS = 4096  # device events kept to tell where the device is (about 800 steps of 5)
# Host phases in which the host may be ahead of its device (launching, or blocked on a full launch queue or
# a synchronising read): there the device's own position is the rank's. In data or comm the host's is, and
# in a phase of the user's naming (``other``: a checkpoint, an evaluation), which declares a pause.
_HOST_MAY_RUN_AHEAD = frozenset({"compute", "idle"})

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

    __slots__ = ("compute_added", "end", "events", "fetch", "first", "seconds", "wall")

    def __init__(self) -> None:
        self.wall = 0.0  # phases timed outside the step, counted in its wall time
        self.seconds: dict[str, float] = {}
        self.events: list[tuple[str, DeviceEvent, DeviceEvent, float]] = []  # (field, start, end, host seconds)
        self.compute_added = False
        self.fetch: float | None = None  # host seconds in data phases
        self.first: DeviceEvent | None = None  # the device's edge where the step's wall time starts
        self.end: DeviceEvent | None = None  # ... and where it ends


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
        # Every device event recorded, oldest first, with the host's position when it was recorded: the
        # first one not yet complete says where the device is. Completed ones are dropped at each step.
        self._marks: deque[tuple[DeviceEvent, Position]] = deque(maxlen=MAX_MARKS)
        self._pending: deque[tuple[dict[str, Any], Collected]] = deque()  # steps awaiting device events

    # -- where the rank is ------------------------------------------------------------------------

    def position(self) -> dict[str, Any]:
        """Where the rank is now: the step it is in, its phase and since when (Unix time).

        That is the host's, unless the host may have run ahead of its device (in compute, or between
        steps) and the device has not reached the newest event recorded: then the
        device's, which is where the host was when it recorded the first event the device has not reached.
        So a rank whose host ran ahead, or blocks on its launch queue, while its device still waits in a
        collective reports ``comm``; a device still busy with a step's work reports that step's phase.
        """
        step, phase, since = self._position
        if phase in _HOST_MAY_RUN_AHEAD and self._marks:
            device = self._device_position()
            if device is not None:
                step, phase, since = device
        return {"step": step, "phase": phase, "since": time.time() - (time.perf_counter() - since)}

    def _device_position(self) -> Position | None:
        """Where the host was when it recorded the first event the device has not completed (None: none)."""
        try:
            marks = tuple(self._marks)  # the training thread appends and drops meanwhile
            for event, where in marks:
                if not event.query():  # thread-safe and non-blocking on CUDA
                    return where
        except Exception:  # a look at the device must never break the heartbeat
            return None
        return None

    @property
    def step(self) -> int:
        """The step the rank is in (the next one when between steps)."""
        return self._position[0]

    def now_in(self, phase: str, step: int | None = None) -> None:
        """The rank is in ``phase`` (of :data:`fleetscope.wire.PHASES`) from now; nothing is timed."""
        if phase not in wire.PHASES or phase == "ended":
            raise ValueError(f"unknown phase {phase!r}")
        self._position = (step if step is not None else self._position[0], phase, time.perf_counter())

    # -- phases -----------------------------------------------------------------------------------

    def enter(self, phase: str, since: float | None = None, event: DeviceEvent | None = None) -> Mark:
        """The rank is in ``phase`` from now, or from ``since`` (a ``time.perf_counter()`` reading).

        ``data`` and ``comm`` are booked as such when left; ``compute`` and other names only say where the
        rank is (their time is the step's compute, the rest of the step). Leave it with :meth:`leave`.
        With a device, ``data`` and ``comm`` are timed by device events (recorded now, or ``event``: one
        :meth:`mark` recorded at ``since``); ``data`` keeps the host's time too, as the fetch.
        """
        started = time.perf_counter() if since is None else since
        position = self._position
        carry_edge = self._current is None and self._depth == 0 and self._carry.first is None
        if event is None and self._marker is not None and (phase in DEVICE_TIMED or carry_edge):
            event = self._record(position)
        if carry_edge:
            self._carry.first = event  # the step's wall time starts here, on the device too
        self._position = (position[0], phase if phase in PHASES else "other", started)
        self._depth += 1
        return Mark(phase, _BOOKED.get(phase), position[1], started, event if phase in DEVICE_TIMED else None)

    def leave(self, mark: Mark) -> float:
        """Back to the phase before ``mark``'s; books its time (host seconds, or its device events). Returns the
        host seconds."""
        now = time.perf_counter()
        elapsed = now - mark.started
        self._depth -= 1
        position = self._position
        self._position = (position[0], mark.saved, now)
        # Recorded after the position changed: recording blocks while the launch queue is full, and a host
        # blocked on its device is not in the phase it left (a fetch that ended). The device reaches this
        # event at the end of the phase's region, so it carries the phase's position.
        end = self._record(position) if mark.event is not None else None
        target = self._current or self._carry
        if self._current is None and self._depth == 0:
            target.wall += elapsed  # outside a step: part of the next step's wall time
        field = mark.field
        if field is not None:
            if field == _DATA:
                target.fetch = (target.fetch or 0.0) + elapsed
            if mark.event is not None and end is not None:
                target.events.append((field, mark.event, end, elapsed))
            else:
                target.seconds[field] = target.seconds.get(field, 0.0) + elapsed
        return elapsed

    def book(self, phase: str, seconds: float, *, before_step: bool = False) -> None:
        """Book ``seconds`` measured elsewhere to ``phase`` (``data``, ``compute`` or ``comm``) of the open step,
        or of the next one when none is open. ``before_step``: the time passed outside the step and counts in
        the next step's wall time too. Booked ``compute`` replaces "the rest"."""
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
        return self._record(self._position)

    def _record(self, where: Position) -> DeviceEvent | None:
        if self._marker is None:
            return None
        try:
            event = self._marker()
        except Exception as exc:
            self._on_error(exc)
            return None
        self._marks.append((event, where))
        return event

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
        carry = self._carry
        if carry.first is None and self._marker is not None:
            carry.first = self._record(self._position)
        self._current, self._carry = carry, Collected()
        started = time.perf_counter()
        self._position = (number, "compute", started)
        return number, started

    def end_step(self, number: int, started: float, fields: dict[str, Any] | None) -> None:
        """Close the open step; ``fields`` (tokens, samples, loss) None: it failed and is not reported.

        With a device, the step waits (in order) until its events completed; then its wall time is the
        device's from the step's first edge to its end, data and comm are the device's, and compute the rest.
        """
        now = time.perf_counter()
        collected = self._current or Collected()
        self._current = None
        if collected.first is not None:
            collected.end = self._record(self._position)
        self._position = (number + 1, "idle", now)
        self.next_step = number + 1
        if fields is None:
            return  # a failed step is not a step
        entry: dict[str, Any] = {"step": number, "step_seconds": now - started + collected.wall,
                                 "timestamp": time.time()}
        entry.update(collected.seconds)
        entry.update(fields)
        if collected.fetch is not None:
            entry[FETCH] = collected.fetch
        if collected.events or collected.end is not None or self._pending:  # in order, behind those waiting
            self._pending.append((entry, collected))
            self._drop_completed_marks()
            self.resolve(force=len(self._pending) > MAX_PENDING_DEVICE)
        else:
            self._deliver(_with_compute(entry, collected))

    def _drop_completed_marks(self) -> None:
        marks = self._marks
        try:
            while marks and marks[0][0].query():
                marks.popleft()
        except Exception as exc:
            self._on_error(exc)
            marks.clear()

    def reported(self, number: int) -> None:
        """A step the caller timed itself was reported: the rank is between steps."""
        self.next_step = number + 1
        self._position = (number + 1, "idle", time.perf_counter())

    def resolve(self, force: bool = False) -> None:
        """Deliver steps whose device events completed (never waits on the device); ``force``: the oldest
        step goes with its host-clock times if its events have not."""
        while self._pending:
            entry, collected = self._pending[0]
            edges = (collected.first, collected.end) if collected.first is not None else None
            step: float | None = None
            try:
                done = all(end.query() for _, _, end, _ in collected.events) and (
                    edges is None or edges[1] is None or edges[1].query())
                if not done and not force:
                    return
                # Too far behind: the host clock's measure rather than hold more records.
                values = [(field, start.elapsed_time(end) / 1000.0 if done else host_seconds)
                          for field, start, end, host_seconds in collected.events]
                if done and edges is not None and edges[1] is not None:
                    step = max(0.0, edges[0].elapsed_time(edges[1]) / 1000.0)
            except Exception as exc:  # a device error: the host clock's measure
                self._on_error(exc)
                values = [(field, host_seconds) for field, _, _, host_seconds in collected.events]
                step = None
            if step is not None:
                entry["step_seconds"] = step  # the device's view of the step: its wall time on the device
            for field, value in values:
                entry[field] = entry.get(field, 0.0) + value
            self._pending.popleft()
            self._deliver(_with_compute(entry, collected))
            force = False

    def flush(self, wait: float = 0.0) -> None:
        """Deliver every step still awaiting device events: those that complete within ``wait`` seconds
        (polled, never synchronising the device) with the device's times, the rest with the host's."""
        deadline = time.monotonic() + wait
        while self._pending and time.monotonic() < deadline:
            self.resolve()
            if self._pending:
                time.sleep(0.002)
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
