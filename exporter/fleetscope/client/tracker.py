"""StepTracker: time steps and their phases in a training loop and push them in the background.

    tracker = StepTracker()                     # job, rank, GPU from torchrun or Slurm
    model = tracker.watch(model)                # DDP / FSDP: collective waits booked as comm
    for batch in tracker.loader(loader):        # each fetch booked as data
        with tracker.step():                    # the rest of the step is compute
            loss = model(batch).sum()
            loss.backward()
            optimizer.step()
    tracker.close()

A step's wall time runs from entering ``tracker.step()`` to leaving it, plus
the time of phases timed since the previous step ended (the loader's fetch).
It splits into ``data`` (phases named so, and the loader's fetches), ``comm``
(exposed collective waits, from :meth:`StepTracker.watch` or phases named so)
and ``compute``: what is left, the rank's own work. :meth:`StepTracker.add`
books a duration measured elsewhere; added ``compute`` replaces the rest.

While the process lives, the sender thread reports the rank's *position*
once a second: the step it is in, its phase (``data``, ``compute``, ``comm``,
``other`` for a phase of the user's naming, ``idle`` between steps) and since
when. The training thread only writes one attribute per phase change for it.

Every public method swallows its own errors: a monitoring bug must never
stop training.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from fleetscope import record
from fleetscope.client.placement import detect, node_gpu, process_start_time, push_url
from fleetscope.client.sender import Sender, SenderStats

logger = logging.getLogger("fleetscope.client")

# Phases whose time a step's record carries, by the record field that carries it.
PHASES = {name: f"{name}_seconds" for name in ("data", "compute", "comm")}
assert set(PHASES.values()) <= set(record.names(record.Role.DURATION, record.STEP_FIELDS))
_DATA, _COMPUTE, _COMM = PHASES["data"], PHASES["compute"], PHASES["comm"]
MAX_PENDING_GPU = 64  # steps awaiting CUDA events before their host-clock times are used instead
T = TypeVar("T")


class _Open:
    """The time a step has collected so far (also what is carried to the next step between steps)."""

    __slots__ = ("compute_added", "events", "seconds", "wall")

    def __init__(self) -> None:
        self.wall = 0.0  # phases timed outside the step, counted in its wall time
        self.seconds: dict[str, float] = {}
        self.events: list[tuple[str, Any, Any, float]] = []  # (field, start, end, host seconds)
        self.compute_added = False


class _Phase:
    __slots__ = ("_field", "_position_phase", "_saved_phase", "_started", "_tracker")

    def __init__(self, tracker: StepTracker, name: str) -> None:
        self._tracker = tracker
        self._field = PHASES.get(name) if name != "compute" else None  # compute is what is left
        self._position_phase = name if name in PHASES else "other"
        self._started = 0.0
        self._saved_phase = "idle"

    def __enter__(self) -> _Phase:
        tracker = self._tracker
        step, self._saved_phase, _ = tracker._position
        self._started = started = time.perf_counter()
        tracker._position = (step, self._position_phase, started)
        tracker._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        now = time.perf_counter()
        elapsed = now - self._started
        tracker = self._tracker
        tracker._depth -= 1
        tracker._position = (tracker._position[0], self._saved_phase, now)
        target = tracker._current or tracker._carry
        if tracker._current is None and tracker._depth == 0:
            target.wall += elapsed  # outside a step: part of the next step's wall time
        if self._field is not None:
            target.seconds[self._field] = target.seconds.get(self._field, 0.0) + elapsed


class _Step:
    """The open step: its fields can be set inside the ``with`` block (``s.loss = ...``)."""

    __slots__ = ("_started", "_tracker", "loss", "samples", "step", "tokens")

    def __init__(
        self,
        tracker: StepTracker,
        step: int | None,
        tokens: int | None,
        samples: int | None,
        loss: float | None,
    ) -> None:
        self._tracker = tracker
        self.step = step
        self.tokens = tokens
        self.samples = samples
        self.loss = loss
        self._started = 0.0

    def __enter__(self) -> _Step:
        tracker = self._tracker
        if self.step is None:
            self.step = tracker._next_step
        tracker._current, tracker._carry = tracker._carry, _Open()
        self._started = started = time.perf_counter()
        tracker._position = (self.step, "compute", started)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        now = time.perf_counter()
        elapsed = now - self._started
        tracker = self._tracker
        collected = tracker._current or _Open()
        tracker._current = None
        number = self.step if self.step is not None else tracker._next_step
        tracker._position = (number + 1, "idle", now)
        if exc_type is not None:
            tracker._next_step = number + 1
            return  # a failed step is not a step; the exception goes on to the caller
        tracker._finish(self, number, elapsed + collected.wall, collected)


class _Loader:
    """``tracker.loader(loader)``: iterate ``loader``, booking each fetch as ``data``.

    Every ``for`` starts a new pass (a new epoch, for a DataLoader: its workers start in the first
    fetch, which is booked too). Attributes are the wrapped loader's (``len``, ``sampler.set_epoch``,
    ``set_epoch``), so the wrapper can stand in for it.
    """

    def __init__(self, tracker: StepTracker, iterable: Iterable[T]) -> None:
        self._tracker = tracker
        self._iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        tracker = self._tracker
        with tracker.phase("data"):
            iterator = iter(self._iterable)
        while True:
            with tracker.phase("data"):
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
            yield batch

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterable, name)


class _Steps(_Loader):
    """``tracker.steps(loader)``: one step per batch, from its fetch (booked as ``data``) to the next fetch.

    The step ends when the loop asks for the next batch, or leaves (``break``, the end of the data).
    Samples are counted from the batch's first tensor, when it has one.
    """

    def __iter__(self) -> Iterator[Any]:
        tracker = self._tracker
        for batch in super().__iter__():
            step = tracker.step(samples=batch_size(batch))
            step.__enter__()
            try:
                yield batch
            finally:  # the next batch was asked for, or the loop ended: the step is done either way
                step.__exit__(None, None, None)


def batch_size(batch: Any) -> int | None:
    """The first dimension of a batch's first tensor (a tensor, a sequence or a dict of them), if any."""
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    try:
        return int(shape[0]) if shape else None
    except (TypeError, ValueError, IndexError):
        return None


class StepTracker:
    def __init__(
        self,
        job: str | None = None,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        pp_stage: int | None = None,
        dp_rank: int | None = None,
        gpu: int | str | None = None,
        url: str | None = None,
        token: str | None = None,
        cuda_events: bool = True,
        batch_size: int = 256,
        capacity: int = 10_000,
        flush_interval: float = 1.0,
        timeout: float = 2.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """Job, ranks and GPU default to the launcher's environment (see :mod:`.placement`).

        ``cuda_events``: time the collective waits of :meth:`watch`-ed models on GPUs with CUDA events
        (read later, never synchronising the device) rather than the host clock, which on a GPU sees
        only the launch of asynchronous work.
        """
        env = os.environ if environ is None else environ
        placement = detect(job, rank, local_rank, world_size, env)
        self.job = placement.job
        self.rank = placement.rank
        self._environ = env
        self._gpu_given = gpu is not None
        # The rank's fields, the same in every report of this process.
        self._fields: dict[str, Any] = {"job": placement.job, "rank": placement.rank}
        for key, value in (
            ("local_rank", placement.local_rank),
            ("world_size", placement.world_size),
            ("pp_stage", pp_stage),
            ("dp_rank", dp_rank),
            ("gpu", gpu if gpu is not None else node_gpu(env, placement.local_rank)),
            ("pid", os.getpid()),
            ("start_time", process_start_time()),
            ("session", random.getrandbits(62)),
        ):
            if value is not None:
                self._fields[key] = value
        self.cuda_events = cuda_events
        self._next_step = 1
        self._current: _Open | None = None
        self._carry = _Open()
        self._depth = 0  # phases open now
        # (step, phase, since): written by the training thread, read by the sender's. ``since`` is on the
        # perf_counter clock (no wall-clock read on the training thread); position() converts it.
        self._position: tuple[int, str, float] = (1, "idle", time.perf_counter())
        self._device_wait: tuple[Any, float] | None = None  # (end event, perf_counter start) of a GPU wait
        self._pending: deque[tuple[dict[str, Any], _Open]] = deque()  # steps awaiting CUDA events
        self.errors = 0
        ref = weakref.ref(self)
        self.sender = Sender(
            push_url(url, env),
            token if token is not None else env.get("FLEETSCOPE_PUSH_TOKEN"),
            batch_size=batch_size,
            capacity=capacity,
            flush_interval=flush_interval,
            timeout=timeout,
            rank_fields=self._fields,
            position=lambda: _position_of(ref),
        )
        self.sender.start()

    # -- timing -------------------------------------------------------------------------------

    def step(
        self,
        step: int | None = None,
        *,
        tokens: int | None = None,
        samples: int | None = None,
        loss: float | None = None,
    ) -> _Step:
        """Context manager timing one step (numbered 1, 2, ... unless ``step`` is given)."""
        return _Step(self, step, tokens, samples, loss)

    def phase(self, name: str) -> _Phase:
        """Context manager timing a phase: ``data`` and ``comm`` are booked as such; ``compute`` and other
        names only mark where the rank is (their time is the step's compute, the rest of the step)."""
        return _Phase(self, name)

    def add(self, phase: str, seconds: float) -> None:
        """Add a duration measured elsewhere to a phase (``data``, ``compute`` or ``comm``) of the open
        step, or of the next step when none is open. Added ``compute`` replaces "the rest of the step".
        Call it from the training thread, or while that thread waits for the measured work."""
        try:
            field = PHASES[phase]
            value = float(seconds)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{phase} seconds must be a finite number >= 0, got {seconds!r}")
            target = self._current or self._carry
            target.seconds[field] = target.seconds.get(field, 0.0) + value
            if field == _COMPUTE:
                target.compute_added = True
        except Exception as exc:
            self._error(exc)

    def now_in(self, phase: str, step: int | None = None) -> None:
        """Say which phase the rank is in from now on (``data``, ``compute``, ``comm``, ``other`` or ``idle``),
        for loops that time themselves and push with :meth:`report`; the next phase or step replaces it.
        Only the position changes: nothing is timed or booked."""
        try:
            if phase not in record.PHASES or phase == "ended":
                raise ValueError(f"unknown phase {phase!r}")
            number = step if step is not None else self._position[0]
            self._position = (number, phase, time.perf_counter())
        except Exception as exc:
            self._error(exc)

    def loader(self, iterable: Iterable[T]) -> Iterable[T]:
        """``for batch in tracker.loader(loader):`` books each fetch (and starting each pass) as ``data``."""
        return _Loader(self, iterable)

    def steps(self, iterable: Iterable[T]) -> Iterable[T]:
        """``for batch in tracker.steps(loader):`` makes each batch one step, its fetch booked as ``data``.

        For steps of several batches (gradient accumulation), use :meth:`loader` and :meth:`step`.
        """
        return _Steps(self, iterable)

    def watch(self, model: T) -> T:
        """Book the exposed collective waits of a DDP, FSDP2 (``fully_shard``) or FSDP1 model as ``comm``.

        Returns the model. Needs torch (imported here, not before). See :mod:`fleetscope.client.distributed`.
        """
        try:
            from fleetscope.client.distributed import watch  # lazy: imports torch

            watch(self, model)  # type: ignore[arg-type]  # any object: watch() checks what it is
        except Exception as exc:
            self._error(exc)
        return model

    def _add_before_step(self, phase: str, seconds: float) -> None:
        """Book time spent before the next step opened (a framework's batch fetch) into that step."""
        if self._current is None and seconds > 0:
            self._carry.wall += seconds
        self.add(phase, seconds)

    def _add_device_time(self, phase: str, start: Any, end: Any, host_seconds: float) -> None:
        """Book a duration known later from CUDA events (``host_seconds`` if they do not complete)."""
        target = self._current or self._carry
        target.events.append((PHASES[phase], start, end, host_seconds))

    def _set_device(self, ordinal: int) -> None:
        """The CUDA device the model lives on, once known: names the GPU exactly."""
        if not self._gpu_given:
            gpu = node_gpu(self._environ, self._fields.get("local_rank"), ordinal)
            if gpu is not None:
                self._fields["gpu"] = gpu
                if self.sender.rank_fields is not None:
                    self.sender.rank_fields["gpu"] = gpu

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

    def _finish(self, step: _Step, number: int, seconds: float, collected: _Open) -> None:
        try:
            self._next_step = number + 1
            entry: dict[str, Any] = {"step": number, "step_seconds": seconds, "timestamp": time.time()}
            entry.update(collected.seconds)
            for key in ("tokens", "samples", "loss"):
                value = getattr(step, key)
                if value is not None:
                    entry[key] = _plain(value)
            if collected.events or self._pending:  # in order: behind steps awaiting their events
                self._pending.append((entry, collected))
            else:
                self.sender.put(_with_compute(entry, collected))
            if self._pending:
                self._resolve_device_times(force=len(self._pending) > MAX_PENDING_GPU)
        except Exception as exc:
            self._error(exc)

    def _resolve_device_times(self, force: bool = False) -> None:
        """Push steps whose CUDA events completed (never waits on the device)."""
        while self._pending:
            entry, collected = self._pending[0]
            done = all(end.query() for _, _, end, _ in collected.events)
            if not done and not force:
                return
            for field, start, end, host_seconds in collected.events:
                # Too far behind: the host clock's measure rather than hold more records.
                value = start.elapsed_time(end) / 1000.0 if done else host_seconds
                entry[field] = entry.get(field, 0.0) + value
            self._pending.popleft()
            self.sender.put(_with_compute(entry, collected))
            force = False

    # -- plain reporting ----------------------------------------------------------------------

    def report(
        self,
        step_seconds: float,
        step: int | None = None,
        *,
        data_seconds: float | None = None,
        compute_seconds: float | None = None,
        comm_seconds: float | None = None,
        tokens: int | None = None,
        samples: int | None = None,
        loss: float | None = None,
        timestamp: float | None = None,
    ) -> None:
        """Push one step measured by the caller."""
        try:
            number = step if step is not None else self._next_step
            self._next_step = number + 1
            self._position = (number + 1, "idle", time.perf_counter())
            entry: dict[str, Any] = {"step": number, "step_seconds": _plain(step_seconds)}
            entry["timestamp"] = timestamp if timestamp is not None else time.time()
            for key, value in (
                (_DATA, data_seconds),
                (_COMPUTE, compute_seconds),
                (_COMM, comm_seconds),
                ("tokens", tokens),
                ("samples", samples),
                ("loss", loss),
            ):
                if value is not None:
                    entry[key] = _plain(value)
            self.sender.put(entry)
        except Exception as exc:
            self._error(exc)

    # -- lifecycle ----------------------------------------------------------------------------

    def stats(self) -> SenderStats:
        return self.sender.stats()

    def close(self, timeout: float = 5.0, goodbye: bool = True) -> None:
        """Push what is left (steps awaiting CUDA events included), say goodbye, stop the sender.

        ``goodbye=False`` stops reporting at once, as a process that died would (for simulators and tests).
        """
        try:
            if not goodbye:
                self.sender.abandon()
                return
            while self._pending:
                self._resolve_device_times(force=True)
            self.sender.close(timeout)
        except Exception as exc:
            self._error(exc)

    def __enter__(self) -> StepTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error(self, exc: Exception) -> None:
        self.errors += 1
        if self.errors == 1:
            logger.warning("fleetscope: step tracking error (further ones are logged at debug): %r", exc)
        else:
            logger.debug("fleetscope: step tracking error: %r", exc)


def _position_of(ref: weakref.ref[StepTracker]) -> dict[str, Any] | None:
    tracker = ref()
    return tracker.position() if tracker is not None else None


def _with_compute(entry: dict[str, Any], collected: _Open) -> dict[str, Any]:
    """The step's compute: what was added as such, or the rest of the step after data and comm."""
    if not collected.compute_added:
        rest = entry["step_seconds"] - entry.get(_DATA, 0.0) - entry.get(_COMM, 0.0)
        entry[_COMPUTE] = max(0.0, rest)
    return entry


def _plain(value: Any) -> Any:
    """A 0-d tensor or numpy scalar becomes a Python number (``.item()``); others pass through."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value
