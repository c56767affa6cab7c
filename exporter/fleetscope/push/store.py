"""In-memory state of pushed training steps, per (job, rank).

Written by the push API (event loop and threadpool), read by scrapes. One lock
guards everything; a batch is first validated and summed per rank outside the
lock, so the lock is held for a few dict updates per rank, not per record.
A batch is all-or-nothing: the limits on jobs and ranks are checked for the
whole batch before anything is applied.

Readers get frozen :class:`RankView` snapshots; nothing here knows about
Prometheus.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fleetscope.config import PushConfig
from fleetscope.push.models import StepRecord

DURATIONS = ("step", "data", "compute", "comm")
EXPIRE_EVERY = 1.0  # seconds between expiry sweeps on the push path


class LimitExceeded(Exception):
    """A push would track more jobs or ranks than configured; nothing was stored."""


@dataclass(frozen=True)
class RankView:
    """What the daemon knows about one rank, at one instant."""

    job: str
    rank: int
    local_rank: int | None
    pp_stage: int | None
    dp_rank: int | None
    world_size: int | None
    gpu: str | None
    steps: int
    seconds: Mapping[str, float]  # duration name -> total; a duration never pushed is absent
    medians: Mapping[str, float]  # duration name -> rolling median over the window
    tokens: int | None
    samples: int | None
    last_step: int
    last_step_timestamp: float
    last_push_timestamp: float
    loss: float | None


@dataclass(frozen=True)
class StoreView:
    ranks: tuple[RankView, ...]
    jobs: int
    records_total: int
    rejected: Mapping[str, int]
    expired: Mapping[str, int]


@dataclass
class _Rank:
    job: str
    rank: int
    window: int
    local_rank: int | None = None
    pp_stage: int | None = None
    dp_rank: int | None = None
    world_size: int | None = None
    gpu: str | None = None
    steps: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    recent: dict[str, deque[float]] = field(default_factory=dict)
    tokens: int | None = None
    samples: int | None = None
    last_step: int = 0
    last_step_timestamp: float = 0.0
    last_push: float = 0.0
    loss: float | None = None


@dataclass
class _Delta:
    """A batch's records for one rank, summed outside the lock."""

    last: StepRecord
    last_timestamp: float
    steps: int
    seconds: dict[str, float]
    recent: dict[str, list[float]]
    tokens: int | None
    samples: int | None
    loss: float | None


def _summarise(records: list[StepRecord], now: float, window: int) -> _Delta:
    seconds: dict[str, float] = {}
    recent: dict[str, list[float]] = {}
    for name in DURATIONS:
        values = [v for v in (getattr(r, f"{name}_seconds") for r in records) if v is not None]
        if values:
            seconds[name] = sum(values)
            recent[name] = values[-window:] if window else []
    tokens = [r.tokens for r in records if r.tokens is not None]
    samples = [r.samples for r in records if r.samples is not None]
    losses = [r.loss for r in records if r.loss is not None]
    last = records[-1]
    return _Delta(
        last=last,
        last_timestamp=last.timestamp if last.timestamp is not None else now,
        steps=len(records),
        seconds=seconds,
        recent=recent,
        tokens=sum(tokens) if tokens else None,
        samples=sum(samples) if samples else None,
        loss=losses[-1] if losses else None,
    )


class Counter:
    """Named counts behind a lock (rejections by reason, expiries by kind)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def inc(self, key: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class StepStore:
    """Per-rank step state with limits, rolling windows and expiry."""

    def __init__(self, config: PushConfig, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._jobs: dict[str, int] = {}  # job -> number of tracked ranks
        self._records_total = 0
        self._last_sweep = 0.0
        self.rejected = Counter()
        self.expired = Counter()

    # -- writing ------------------------------------------------------------------------------

    def ingest(self, records: list[StepRecord]) -> int:
        """Store a validated batch; raises :class:`LimitExceeded` (storing nothing) past the limits."""
        if not records:
            return 0
        now = self._clock()
        grouped: dict[tuple[str, int], list[StepRecord]] = {}
        for record in records:
            grouped.setdefault((record.job, record.rank), []).append(record)
        window = self._config.median_window
        deltas = {key: _summarise(recs, now, window) for key, recs in grouped.items()}
        with self._lock:
            self._sweep_locked(now)
            new_keys = [key for key in deltas if key not in self._ranks]
            if new_keys:
                new_jobs = {job for job, _ in new_keys if job not in self._jobs}
                if len(self._jobs) + len(new_jobs) > self._config.max_jobs:
                    raise LimitExceeded(
                        f"push would track {len(self._jobs) + len(new_jobs)} jobs; this node allows "
                        f"{self._config.max_jobs} (push.max-jobs)"
                    )
                if len(self._ranks) + len(new_keys) > self._config.max_ranks:
                    raise LimitExceeded(
                        f"push would track {len(self._ranks) + len(new_keys)} ranks; this node allows "
                        f"{self._config.max_ranks} (push.max-ranks)"
                    )
            for key, delta in deltas.items():
                state = self._ranks.get(key)
                if state is None:
                    state = self._ranks[key] = _Rank(job=key[0], rank=key[1], window=window)
                    self._jobs[key[0]] = self._jobs.get(key[0], 0) + 1
                self._apply_locked(state, delta, now)
            self._records_total += len(records)
        return len(records)

    @staticmethod
    def _apply_locked(state: _Rank, delta: _Delta, now: float) -> None:
        last = delta.last
        # Placement facts: the newest record that states them wins (a restarted job may move).
        for attr in ("local_rank", "pp_stage", "dp_rank", "world_size"):
            value = getattr(last, attr)
            if value is not None:
                setattr(state, attr, value)
        if last.gpu is not None:
            state.gpu = str(last.gpu)
        state.steps += delta.steps
        for name, total in delta.seconds.items():
            state.seconds[name] = state.seconds.get(name, 0.0) + total
            recent = state.recent.get(name)
            if recent is None:
                recent = state.recent[name] = deque(maxlen=state.window or 1)
            recent.extend(delta.recent[name])
        if delta.tokens is not None:
            state.tokens = (state.tokens or 0) + delta.tokens
        if delta.samples is not None:
            state.samples = (state.samples or 0) + delta.samples
        if delta.loss is not None:
            state.loss = delta.loss
        state.last_step = last.step
        state.last_step_timestamp = delta.last_timestamp
        state.last_push = now

    def end_job(self, job: str) -> int:
        """Forget every rank of ``job`` at once; returns how many ranks went."""
        with self._lock:
            keys = [key for key in self._ranks if key[0] == job]
            for key in keys:
                del self._ranks[key]
            self._jobs.pop(job, None)
            return len(keys)

    # -- expiry -------------------------------------------------------------------------------

    def _sweep_locked(self, now: float, force: bool = False) -> None:
        if not force and now - self._last_sweep < EXPIRE_EVERY:
            return
        self._last_sweep = now
        ttl = self._config.rank_ttl
        stale = [key for key, state in self._ranks.items() if now - state.last_push > ttl]
        for key in stale:
            del self._ranks[key]
            remaining = self._jobs[key[0]] - 1
            if remaining:
                self._jobs[key[0]] = remaining
            else:
                del self._jobs[key[0]]
        if stale:
            self.expired.inc("rank", len(stale))

    # -- reading ------------------------------------------------------------------------------

    def view(self) -> StoreView:
        """A consistent snapshot (expired ranks removed first)."""
        with self._lock:
            self._sweep_locked(self._clock(), force=True)
            # A few hundred medians of <= median_window values: well under a millisecond.
            ranks = tuple(
                RankView(
                    job=s.job,
                    rank=s.rank,
                    local_rank=s.local_rank,
                    pp_stage=s.pp_stage,
                    dp_rank=s.dp_rank,
                    world_size=s.world_size,
                    gpu=s.gpu,
                    steps=s.steps,
                    seconds=dict(s.seconds),
                    medians={name: statistics.median(values) for name, values in s.recent.items() if values},
                    tokens=s.tokens,
                    samples=s.samples,
                    last_step=s.last_step,
                    last_step_timestamp=s.last_step_timestamp,
                    last_push_timestamp=s.last_push,
                    loss=s.loss,
                )
                for s in self._ranks.values()
            )
            jobs = len(self._jobs)
            records_total = self._records_total
        return StoreView(ranks, jobs, records_total, self.rejected.snapshot(), self.expired.snapshot())
