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
``fetch`` is the host's time in data phases. On a GPU (a model ``watch()``-ed
there), the step, data and comm are the device's, from CUDA events at the
phases' edges read once complete: ``data`` is then the GPU's wait for input,
``fetch`` the loader's latency (see :mod:`.timeline`).

While the process lives, the sender thread reports the rank's *position*
once a second: the step it is in, its phase (``data``, ``compute``, ``comm``,
``other`` for a phase of the user's naming, ``idle`` between steps) and since
when. The training thread only writes one attribute per phase change for it.

Every public method swallows its own errors: a monitoring bug must never
stop training. Hooks (:mod:`.distributed`, :mod:`.hf`, :mod:`.lightning`)
time through ``tracker.timeline`` (:mod:`.timeline`), the same seam the
tracker's own context managers use.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from fleetscope.client.placement import (
    claim_rank,
    detect,
    job_id_problem,
    node_gpu,
    process_start_time,
    push_url,
    rank_lease,
    rank_reported_above,
)
from fleetscope.client.sender import Sender, SenderStats
from fleetscope.client.timeline import FETCH, PHASES, Mark, Timeline

logger = logging.getLogger(__name__)

__all__ = ["PHASES", "Phase", "Step", "StepTracker", "batch_size"]
T = TypeVar("T")


class Phase:
    """``with tracker.phase(name):`` the rank is in a phase (see :meth:`StepTracker.phase`)."""

    __slots__ = ("_mark", "_name", "_timeline")

    def __init__(self, timeline: Timeline, name: str) -> None:
        self._timeline = timeline
        self._name = name
        self._mark: Mark | None = None

    def __enter__(self) -> Phase:
        self._mark = self._timeline.enter(self._name)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._mark is not None:
            self._timeline.leave(self._mark)
            self._mark = None


class Step:
    """The open step: its fields can be set inside the ``with`` block (``s.loss = ...``).

    Hooks that cannot use a ``with`` block (a trainer's callbacks) call ``__enter__`` when the step begins
    and ``__exit__(None, None, None)`` when it ends.
    """

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

    def __enter__(self) -> Step:
        self.step, self._started = self._tracker.timeline.begin_step(self.step)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        tracker = self._tracker
        number = self.step if self.step is not None else tracker.timeline.next_step
        fields: dict[str, Any] | None = None
        if exc_type is None:  # a failed step is not a step; the exception goes on to the caller
            try:
                fields = {}
                if self.tokens is not None:
                    fields["tokens"] = _plain(self.tokens)
                if self.samples is not None:
                    fields["samples"] = _plain(self.samples)
                if self.loss is not None:
                    fields["loss"] = _plain(self.loss)
            except Exception as error:
                tracker.count_error(error)
        try:
            tracker.timeline.end_step(number, self._started, fields)
        except Exception as error:
            tracker.count_error(error)


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
            ("lease", rank_lease(placement.job, placement.rank)),
        ):
            if value is not None:
                self._fields[key] = value
        self.cuda_events = cuda_events
        self.errors = 0
        # Where the rank is and what its open step collected: the seam every hook times through.
        self.timeline = Timeline(self._deliver, self.count_error)
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
        # A process below the rank's own (a spawn or forkserver DataLoader worker importing the training script
        # again) must not speak for the rank: no reports, no goodbye.
        self.reporting_process = rank_reported_above(placement.job, placement.rank)
        problem = job_id_problem(placement.job)
        if problem:  # the daemon would refuse every push: say so once, here, and send nothing
            logger.error("fleetscope: %s; this tracker sends nothing", problem)
            self.sender.error = problem
            self.sender.silence()
        elif self.reporting_process is not None:
            logger.info("fleetscope: process %d is below process %d, which reports for rank %d of %s (a DataLoader "
                        "worker?): this tracker stays silent", os.getpid(), self.reporting_process, placement.rank,
                        placement.job)
            self.sender.silence()
        else:
            claim_rank(placement.job, placement.rank)
            self.sender.start()

    # -- timing -------------------------------------------------------------------------------

    def step(
        self,
        step: int | None = None,
        *,
        tokens: int | None = None,
        samples: int | None = None,
        loss: float | None = None,
    ) -> Step:
        """Context manager timing one step (numbered 1, 2, ... unless ``step`` is given)."""
        return Step(self, step, tokens, samples, loss)

    def phase(self, name: str) -> Phase:
        """Context manager timing a phase: ``data`` and ``comm`` are booked as such; ``compute`` and other
        names only mark where the rank is (their time is the step's compute, the rest of the step)."""
        return Phase(self.timeline, name)

    def add(self, phase: str, seconds: float) -> None:
        """Add a duration measured elsewhere to a phase (``data``, ``compute`` or ``comm``) of the open
        step, or of the next step when none is open. Added ``compute`` replaces "the rest of the step".
        Call it from the training thread, or while that thread waits for the measured work."""
        try:
            if phase not in PHASES:
                raise KeyError(phase)
            value = float(seconds)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{phase} seconds must be a finite number >= 0, got {seconds!r}")
            self.timeline.book(phase, value)
        except Exception as exc:
            self.count_error(exc)

    def now_in(self, phase: str, step: int | None = None) -> None:
        """Say which phase the rank is in from now on (``data``, ``compute``, ``comm``, ``other`` or ``idle``),
        for loops that time themselves and push with :meth:`report`; the next phase or step replaces it.
        Only the position changes: nothing is timed or booked."""
        try:
            self.timeline.now_in(phase, step)
        except Exception as exc:
            self.count_error(exc)

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
            self.count_error(exc)
        return model

    def use_gpu(self, ordinal: int) -> None:
        """The CUDA device the rank computes on, once known (``watch()`` tells it): names the GPU exactly,
        unless ``gpu=`` was given."""
        if not self._gpu_given:
            gpu = node_gpu(self._environ, self._fields.get("local_rank"), ordinal)
            if gpu is not None:
                self._fields["gpu"] = gpu
                if self.sender.rank_fields is not None:
                    self.sender.rank_fields["gpu"] = gpu

    def position(self) -> dict[str, Any]:
        """Where the rank is now: the step it is in, its phase and since when (Unix time)."""
        return self.timeline.position()

    def _deliver(self, entry: dict[str, Any]) -> None:
        self.sender.put(entry)

    # -- plain reporting ----------------------------------------------------------------------

    def report(
        self,
        step_seconds: float,
        step: int | None = None,
        *,
        data_seconds: float | None = None,
        fetch_seconds: float | None = None,
        compute_seconds: float | None = None,
        comm_seconds: float | None = None,
        tokens: int | None = None,
        samples: int | None = None,
        loss: float | None = None,
        timestamp: float | None = None,
    ) -> None:
        """Push one step measured by the caller (``fetch_seconds``: the host's time fetching its input, where
        ``data_seconds`` is the device's wait for it)."""
        try:
            number = step if step is not None else self.timeline.next_step
            self.timeline.reported(number)
            entry: dict[str, Any] = {"step": number, "step_seconds": _plain(step_seconds)}
            entry["timestamp"] = timestamp if timestamp is not None else time.time()
            for key, value in (
                (PHASES["data"], data_seconds),
                (FETCH, fetch_seconds),
                (PHASES["compute"], compute_seconds),
                (PHASES["comm"], comm_seconds),
                ("tokens", tokens),
                ("samples", samples),
                ("loss", loss),
            ):
                if value is not None:
                    entry[key] = _plain(value)
            self.sender.put(entry)
        except Exception as exc:
            self.count_error(exc)

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
            self.timeline.flush(wait=min(timeout / 2, 2.0))  # the device's last steps, if it finishes them
            self.sender.close(timeout)
        except Exception as exc:
            self.count_error(exc)

    def __enter__(self) -> StepTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def count_error(self, exc: Exception) -> None:
        """Count a monitoring error (logged once at warning, then at debug): it never reaches the loop."""
        self.errors += 1
        if self.errors == 1:
            logger.warning("fleetscope: step tracking error (further ones are logged at debug): %r", exc)
        else:
            logger.debug("fleetscope: step tracking error: %r", exc)


def _position_of(ref: weakref.ref[StepTracker]) -> dict[str, Any] | None:
    tracker = ref()
    return tracker.position() if tracker is not None else None


def _plain(value: Any) -> Any:
    """A 0-d tensor or numpy scalar becomes a Python number (``.item()``); others pass through."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value
