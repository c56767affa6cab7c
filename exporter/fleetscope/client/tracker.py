"""StepTracker: time steps and their phases in a training loop and push them in the background.

    tracker = StepTracker()                     # job/rank from torchrun or Slurm
    for batch in loader:
        with tracker.step(tokens=n_tokens):
            with tracker.phase("data"):
                batch = next(it)
            with tracker.phase("compute"):
                loss = model(batch).backward()
            with tracker.phase("comm"):
                all_reduce(...)
    tracker.close()

Phases named ``data``, ``compute`` and ``comm`` fill the record's
``data_seconds``, ``compute_seconds`` and ``comm_seconds`` (a phase entered
several times in a step adds up; a phase timed outside any step counts toward
the next step). With ``cuda_events=True`` and a GPU, the ``compute`` phase is
timed with CUDA events instead of the host clock, since kernels run
asynchronously; such records are pushed once their events have completed,
checked without ever synchronising the device.

Every public method swallows its own errors: a monitoring bug must never
stop training.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from fleetscope.client.placement import detect, push_url, visible_gpu
from fleetscope.client.sender import Sender, SenderStats

logger = logging.getLogger("fleetscope.client")

PHASES = {"data": "data_seconds", "compute": "compute_seconds", "comm": "comm_seconds"}
MAX_PENDING_GPU = 64  # steps awaiting CUDA events before we fall back to host timing


class _Phase:
    __slots__ = ("_events", "_field", "_started", "_tracker")

    def __init__(self, tracker: StepTracker, field: str | None) -> None:
        self._tracker = tracker
        self._field = field
        self._started = 0.0
        self._events: Any = None

    def __enter__(self) -> _Phase:
        if self._field == "compute_seconds" and self._tracker._cuda is not None:
            try:
                start = self._tracker._cuda.Event(enable_timing=True)
                start.record()
                self._events = start
            except Exception:
                self._events = None
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self._started
        if self._field is None:
            return
        tracker = self._tracker
        target = tracker._current if tracker._current is not None else tracker._carry
        target[self._field] = target.get(self._field, 0.0) + elapsed
        if self._events is not None:
            try:
                end = tracker._cuda.Event(enable_timing=True)  # type: ignore[union-attr]
                end.record()
                target.setdefault("_cuda", []).append((self._events, end))
            except Exception:
                pass


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
        tracker._current = tracker._carry
        tracker._carry = {}
        self._started = time.perf_counter()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        tracker = self._tracker
        phases = tracker._current or {}
        tracker._current = None
        if exc_type is not None:
            return  # a failed step is not a step; the exception goes on to the caller
        tracker._finish(self, time.perf_counter() - self._started, phases)


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
        cuda_events: bool = False,
        batch_size: int = 256,
        capacity: int = 10_000,
        flush_interval: float = 1.0,
        timeout: float = 2.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        import os

        env = os.environ if environ is None else environ
        placement = detect(job, rank, local_rank, world_size, env)
        self.job = placement.job
        self.rank = placement.rank
        # Fields every record of this process carries.
        self._fixed: dict[str, Any] = {"job": placement.job, "rank": placement.rank}
        for key, value in (
            ("local_rank", placement.local_rank),
            ("world_size", placement.world_size),
            ("pp_stage", pp_stage),
            ("dp_rank", dp_rank),
            ("gpu", gpu if gpu is not None else visible_gpu(env)),
        ):
            if value is not None:
                self._fixed[key] = value
        self.sender = Sender(
            push_url(url, env),
            token if token is not None else env.get("FLEETSCOPE_PUSH_TOKEN"),
            batch_size=batch_size,
            capacity=capacity,
            flush_interval=flush_interval,
            timeout=timeout,
        )
        self._next_step = 1
        self._current: dict[str, Any] | None = None
        self._carry: dict[str, Any] = {}
        self._pending_gpu: deque[tuple[dict[str, Any], list[Any]]] = deque()
        self._cuda = self._cuda_module() if cuda_events else None
        self.errors = 0

    @staticmethod
    def _cuda_module() -> Any:
        try:
            import torch  # lazy: only for CUDA event timing
        except ImportError:
            logger.info("fleetscope: torch not installed; timing compute on the host clock")
            return None
        if not torch.cuda.is_available():
            logger.info("fleetscope: no CUDA device; timing compute on the host clock")
            return None
        return torch.cuda

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
        """Context manager timing a phase: ``data``, ``compute`` or ``comm`` (other names are not pushed)."""
        return _Phase(self, PHASES.get(name))

    def _finish(self, step: _Step, seconds: float, phases: dict[str, Any]) -> None:
        try:
            number = step.step if step.step is not None else self._next_step
            self._next_step = number + 1
            record = dict(self._fixed)
            record["step"] = number
            record["step_seconds"] = seconds
            record["timestamp"] = time.time()
            cuda_pairs = phases.pop("_cuda", None)
            record.update(phases)
            for key in ("tokens", "samples", "loss"):
                value = getattr(step, key)
                if value is not None:
                    record[key] = _plain(value)
            if cuda_pairs:
                self._pending_gpu.append((record, cuda_pairs))
            else:
                self.sender.put(record)
            if self._pending_gpu:
                self._resolve_gpu(force=len(self._pending_gpu) > MAX_PENDING_GPU)
        except Exception as exc:
            self._error(exc)

    def _resolve_gpu(self, force: bool = False) -> None:
        """Push steps whose CUDA events completed (never waits on the device)."""
        while self._pending_gpu:
            record, pairs = self._pending_gpu[0]
            if not all(end.query() for _, end in pairs):
                if not force:
                    return
                # Too far behind: keep the host-clock compute time rather than hold more records.
            else:
                record["compute_seconds"] = sum(start.elapsed_time(end) for start, end in pairs) / 1000.0
            self._pending_gpu.popleft()
            self.sender.put(record)
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
            record = dict(self._fixed)
            record["step"] = number
            record["step_seconds"] = step_seconds
            record["timestamp"] = timestamp if timestamp is not None else time.time()
            for key, value in (
                ("data_seconds", data_seconds),
                ("compute_seconds", compute_seconds),
                ("comm_seconds", comm_seconds),
                ("tokens", tokens),
                ("samples", samples),
                ("loss", loss),
            ):
                if value is not None:
                    record[key] = _plain(value)
            self.sender.put(record)
        except Exception as exc:
            self._error(exc)

    # -- lifecycle ----------------------------------------------------------------------------

    def stats(self) -> SenderStats:
        return self.sender.stats()

    def close(self, timeout: float = 5.0) -> None:
        """Push what is left (steps awaiting CUDA events included) and stop the sender."""
        try:
            if self._pending_gpu:
                self._resolve_gpu(force=True)
                while self._pending_gpu:
                    self._resolve_gpu(force=True)
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


def _plain(value: Any) -> Any:
    """A 0-d tensor or numpy scalar becomes a Python number (``.item()``); others pass through."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value
