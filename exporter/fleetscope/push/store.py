"""In-memory state of pushed training steps and positions, per (job, rank).

Written by the push API (event loop and threadpool), read by scrapes. One lock
guards everything; a push is validated and grouped per rank before the lock,
so the lock is held for a few dict updates per rank. The limits on jobs and
ranks are checked for the whole push before anything is applied.

What is kept of each field follows its :class:`~fleetscope.wire.Role`, and
the values a scrape reads are keyed by :func:`fleetscope.wire.value_keys`,
so no field name is written here.

A rank belongs to its process (#35 item 5): a report may carry the reporting process's lease (a random
secret the client makes); the first lease a rank reports is kept, and while that process lives
(:class:`~fleetscope.push.process.ProcessTable` says so or, where the daemon cannot see it, it reported in
the last :data:`LEASE_IDLE` seconds) and has not said ``ended``, a push for the rank without that lease,
or ending its job, is refused whole (:class:`LeaseHeld`, 409). A daemon restart forgets the leases; the
next report adopts the one it carries.

Applying a push is atomic: every check (limits, leases) runs before anything changes, and each rank's new
state is built on a copy and swapped in at the end, so a push that fails half-way changes nothing and its
retry is not counted twice.

Bad input is refused and counted, never fatal: within one process of a rank
(same ``pid``, ``start_time`` and ``session``) a step at or below the last one is out of
order; a completion time in the future or before the rank's previous one (a
clock that went backwards) is replaced by the time the daemon received it;
a new process of the same rank (a restart, which may begin again at step 0)
starts its own order. Readers get frozen :class:`RankView` snapshots; nothing
here knows about Prometheus.

Every instant is kept on the monotonic clock (:mod:`fleetscope.clock`), so a step of the node's wall
clock neither expires ranks nor freezes their progress. A time a rank reports (its step's completion,
its phase's start) is on the same node's wall clock as the daemon's, so it is read as an age at the
moment it arrives; views give instants back as Unix time on the wall clock of the view.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetscope import wire
from fleetscope.clock import Clock, Now, SystemClock
from fleetscope.config import PushConfig
from fleetscope.push.models import RankReport
from fleetscope.wire import Role

EXPIRE_EVERY = 1.0  # seconds between expiry sweeps on the push path
LEASE_IDLE = 30.0  # seconds a lease holds after its last report when the daemon cannot see the process
ENDED_TTL = 300.0  # an ended rank's series stay this long, so the last scrapes see its final counts
CLOCK_SLACK = 5.0  # a completion time this far ahead of the daemon's clock is a wrong clock

_DURATIONS = wire.names(Role.DURATION, wire.STEP_FIELDS)
_COUNTS = wire.names(Role.COUNT, wire.STEP_FIELDS)
_LATEST = wire.names(Role.LATEST, wire.STEP_FIELDS)
(_NUMBER,) = wire.names(Role.NUMBER, wire.STEP_FIELDS)
(_TIME,) = wire.names(Role.TIME, wire.STEP_FIELDS)
_PROCESS = wire.names(Role.PROCESS, wire.RANK_FIELDS)
_SESSION = _PROCESS + wire.names(Role.SESSION, wire.RANK_FIELDS)


class LimitExceeded(Exception):
    """A push would track more jobs or ranks than configured; nothing was stored."""


class LeaseHeld(Exception):
    """A live rank's process holds its lease and this push does not carry it (HTTP 409); nothing was stored."""


@dataclass(frozen=True)
class Position:
    step: int
    phase: str
    since: float  # when the rank entered the phase (never after the daemon received it): Unix time in a
    # view, an instant on the monotonic clock inside the store


@dataclass(frozen=True)
class RankView:
    """What the daemon knows about one rank, at one instant."""

    job: str
    rank: int
    fields: Mapping[str, Any]  # placement and process fields, as last stated
    values: Mapping[str, float]  # by wire.value_keys(); a value never reported is absent
    position: Position | None  # None: the rank never reported one (an older client, or report())

    @property
    def process(self) -> tuple[int, int] | None:
        """(pid, start_time) of the rank's process, when it said."""
        pid, start = (self.fields.get(name) for name in _PROCESS)
        return (pid, start) if pid is not None and start is not None else None


@dataclass(frozen=True)
class StoreView:
    ranks: tuple[RankView, ...]
    jobs: int
    records_total: int
    rejected: Mapping[str, int]
    expired: Mapping[str, int]
    wall: float  # the node's wall clock when the view was taken: the clock of every Unix time in it


@dataclass(frozen=True)
class IngestResult:
    accepted: int  # step records stored
    duplicate: int  # step records already stored (a re-sent report): acknowledged, not counted again


@dataclass
class _Rank:
    window: int
    fields: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    totals: dict[str, float] = field(default_factory=dict)
    recent: dict[str, deque[float]] = field(default_factory=dict)
    latest: dict[str, float] = field(default_factory=dict)  # the completion time: a monotonic instant
    last_push: float = 0.0  # monotonic
    position: Position | None = None  # since: monotonic
    newest_stamp: float | None = None  # the latest completion time a step carried, as the rank stamped it
    ordered: bool = False  # steps of this process must go forward (it said which process it is)
    lease: str | None = None  # the reporting process's secret, once it sent one

    def session(self) -> tuple[Any, ...]:
        return tuple(self.fields.get(name) for name in _SESSION)

    def copy(self) -> _Rank:
        """A copy to apply a push to (its windows at most push.median-window values each)."""
        return replace(self, fields=dict(self.fields), totals=dict(self.totals), latest=dict(self.latest),
                       recent={name: deque(values, maxlen=values.maxlen) for name, values in self.recent.items()})


class Counter:
    """Named counts behind a lock (rejections by reason, expiries by kind)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def inc(self, key: str, amount: int = 1) -> None:
        if amount:
            with self._lock:
                self._counts[key] = self._counts.get(key, 0) + amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class StepStore:
    """Per-rank step state with limits, rolling windows and expiry."""

    def __init__(self, config: PushConfig, clock: Clock | None = None,
                 alive: Callable[[int, int], bool | None] | None = None) -> None:
        """``alive(pid, start_time)``: is a lease holder's process running (None: cannot tell)."""
        self._config = config
        self._clock = clock or SystemClock()
        self._alive = alive
        self._lock = threading.Lock()
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._jobs: dict[str, int] = {}  # job -> number of tracked ranks
        self._records_total = 0
        self._last_sweep = -EXPIRE_EVERY
        self.rejected = Counter()
        self.expired = Counter()

    # -- writing ------------------------------------------------------------------------------

    def ingest(self, reports: Sequence[RankReport]) -> IngestResult:
        """Store validated reports; raises :class:`LimitExceeded` (storing nothing) past the limits."""
        if not reports:
            return IngestResult(0, 0)
        now = self._clock.read()
        accepted = duplicate = clock_fixes = 0
        with self._lock:
            self._sweep_locked(now.monotonic)
            new_keys = {(r.job, r.rank) for r in reports} - self._ranks.keys()
            if new_keys:
                self._check_limits_locked(new_keys)
            for report in reports:
                self._check_lease_locked((report.job, report.rank), report.lease, now.monotonic)
            staged: dict[tuple[str, int], _Rank] = {}
            for report in reports:
                key = (report.job, report.rank)
                state = staged.get(key)
                if state is None:
                    held = self._ranks.get(key)
                    state = staged[key] = held.copy() if held is not None else _Rank(window=self._config.median_window)
                stored, refused, fixed = self._apply_locked(state, report, now)
                accepted += stored
                duplicate += refused
                clock_fixes += fixed
            for key, state in staged.items():  # nothing above changed the store: now all of it at once
                if key not in self._ranks:
                    self._jobs[key[0]] = self._jobs.get(key[0], 0) + 1
                self._ranks[key] = state
            self._records_total += accepted
        self.rejected.inc("duplicate", duplicate)
        self.rejected.inc("clock", clock_fixes)
        return IngestResult(accepted, duplicate)

    def _check_limits_locked(self, new_keys: set[tuple[str, int]]) -> None:
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

    def _lease_live(self, state: _Rank, now: float) -> bool:
        """The rank's lease still binds: its process has not said goodbye and lives (or, unseen, reported lately)."""
        if state.lease is None or _ended(state):
            return False
        pid, start = (state.fields.get(name) for name in _PROCESS)
        alive = self._alive(pid, start) if self._alive is not None and pid is not None and start is not None else None
        return alive if alive is not None else now - state.last_push <= LEASE_IDLE

    def _check_lease_locked(self, key: tuple[str, int], lease: str | None, now: float) -> None:
        state = self._ranks.get(key)
        if state is None or state.lease is None or lease == state.lease or not self._lease_live(state, now):
            return
        raise LeaseHeld(f"rank {key[1]} of job {key[0]!r} belongs to a live process, and this push does not carry "
                        "its lease")

    def _apply_locked(self, state: _Rank, report: RankReport, now: Now) -> tuple[int, int, int]:
        """Apply one rank's report; returns (steps stored, steps already stored, clock fixes)."""
        previous_session = state.session()
        # Placement and process facts: the newest push that states them wins (a restarted job may move).
        state.fields.update(report.fields)
        ordered = all(report.fields.get(name) is not None for name in _PROCESS)  # a session id alone is not enough
        if state.session() != previous_session:  # a new process of this rank: its own order and phase
            state.latest.pop(_NUMBER, None)
            state.position = None
        state.ordered = ordered
        stored = refused = fixed = 0
        for step in report.steps:
            number = step[_NUMBER]
            last = state.latest.get(_NUMBER)
            if state.ordered and last is not None and number <= last and not _went_back(state, step, now):
                refused += 1  # a re-send of a report the daemon had stored before the client gave up on it
                continue
            fixed += self._add_step_locked(state, step, now)
            stored += 1
        if report.position is not None:
            since = report.position["since"]
            if since > now.wall:  # a clock ahead of the daemon's: the rank is there now, at the latest
                since, fixed = now.wall, fixed + 1
            state.position = Position(report.position["step"], report.position["phase"], now.instant(since))
        state.last_push = now.monotonic
        # The lease checks passed: this push's lease is the rank's now; a goodbye lets it go.
        state.lease = None if _ended(state) else report.lease
        return stored, refused, fixed

    @staticmethod
    def _add_step_locked(state: _Rank, step: Mapping[str, Any], now: Now) -> int:
        """Add one step's values; returns 1 when its completion time had to be replaced."""
        state.steps += 1
        for name in _DURATIONS:
            value = step.get(name)
            if value is None:
                continue
            state.totals[name] = state.totals.get(name, 0.0) + value
            recent = state.recent.get(name)
            if recent is None:
                recent = state.recent[name] = deque(maxlen=state.window or 1)
            recent.append(value)
        for name in _COUNTS:
            value = step.get(name)
            if value is not None:
                state.totals[name] = state.totals.get(name, 0.0) + value
        for name in _LATEST:
            value = step.get(name)
            if value is not None:
                state.latest[name] = value
        state.latest[_NUMBER] = step[_NUMBER]
        stamp = step.get(_TIME)
        previous = state.latest.get(_TIME)
        fixed = 0
        if stamp is None:
            completed = now.monotonic
        elif stamp > now.wall + CLOCK_SLACK or (previous is not None and now.instant(stamp) < previous - CLOCK_SLACK):
            # A stamp from a wrong clock, or one read across a step of the wall clock: when we heard of it.
            completed, fixed = now.monotonic, 1
        else:
            completed = min(now.instant(stamp), now.monotonic)
            state.newest_stamp = stamp if state.newest_stamp is None else max(state.newest_stamp, stamp)
        state.latest[_TIME] = completed if previous is None else max(previous, completed)
        return fixed

    def end_job(self, job: str, lease: str | None = None) -> int:
        """Forget every rank of ``job`` at once; returns how many ranks went.

        Raises :class:`LeaseHeld` while a rank of the job has a live process and ``lease`` is none of the job's
        ranks' leases (a rank of the job may end it)."""
        with self._lock:
            now = self._clock.read().monotonic
            keys = [key for key in self._ranks if key[0] == job]
            if lease is None or lease not in {self._ranks[key].lease for key in keys}:
                for key in keys:
                    self._check_lease_locked(key, lease, now)
            for key in keys:
                del self._ranks[key]
            self._jobs.pop(job, None)
            return len(keys)

    # -- expiry -------------------------------------------------------------------------------

    def _sweep_locked(self, now: float, force: bool = False) -> None:
        """Drop ranks silent for longer than their TTL (``now``: monotonic)."""
        if not force and now - self._last_sweep < EXPIRE_EVERY:
            return
        self._last_sweep = now
        rank_ttl = self._config.rank_ttl
        stale = [
            key for key, state in self._ranks.items()
            if now - state.last_push > (min(rank_ttl, ENDED_TTL) if _ended(state) else rank_ttl)
        ]
        for key in stale:
            del self._ranks[key]
            remaining = self._jobs[key[0]] - 1
            if remaining:
                self._jobs[key[0]] = remaining
            else:
                del self._jobs[key[0]]
        self.expired.inc("rank", len(stale))

    # -- reading ------------------------------------------------------------------------------

    def view(self, now: Now | None = None) -> StoreView:
        """A consistent snapshot (expired ranks removed first), its times as Unix time on ``now``'s wall clock."""
        with self._lock:
            now = now or self._clock.read()
            self._sweep_locked(now.monotonic, force=True)
            # A few hundred medians of <= median_window values: well under a millisecond.
            ranks = tuple(_view(job, rank, s, now) for (job, rank), s in self._ranks.items())
            jobs = len(self._jobs)
            records_total = self._records_total
        return StoreView(ranks, jobs, records_total, self.rejected.snapshot(), self.expired.snapshot(), now.wall)


def _went_back(state: _Rank, step: Mapping[str, Any], now: Now) -> bool:
    """A lower step number completed after every step stored: the job went back to a checkpoint in-process.

    A re-sent step carries the very stamp it had when first sent, never later than the newest stored: the
    rank's own stamps are compared, not instants, which two readings of the clocks place a hair apart.
    """
    stamp, newest = step.get(_TIME), state.newest_stamp
    return stamp is not None and newest is not None and newest < stamp <= now.wall + CLOCK_SLACK


def _ended(state: _Rank) -> bool:
    return state.position is not None and state.position.phase == "ended"


def _view(job: str, rank: int, state: _Rank, now: Now) -> RankView:
    values: dict[str, float] = {wire.STEPS_KEY: state.steps, wire.LAST_PUSH_KEY: now.unix(state.last_push)}
    values.update(state.totals)
    values.update(state.latest)
    if _TIME in state.latest:
        values[_TIME] = now.unix(state.latest[_TIME])
    for name, window in state.recent.items():
        if window:
            values[wire.median_key(name)] = statistics.median(window)
    position = state.position
    if position is not None:
        position = Position(position.step, position.phase, now.unix(position.since))
    return RankView(job, rank, dict(state.fields), values, position)
