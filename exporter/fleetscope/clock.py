"""The daemon's two clocks: the node's wall clock, and a monotonic one that no one can set.

The wall clock is stepped (NTP at boot, after a suspend, an operator's ``date -s``); the monotonic clock
only runs. So the daemon keeps every instant it must compare (when a rank last pushed, when its phase
began, when its step completed) on the monotonic clock, measures ages and expiry there, and writes an
instant out as Unix time only when it exports it: the wall clock of that moment minus the instant's age.
All of one scrape's timestamps are on the same reading of the wall clock, which the daemon exports too
(``fleetscope_push_scrape_timestamp_seconds``): Prometheus's sample time minus it is the node clock's
offset from Prometheus's, which the progress rules take off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

# Two wall readings this close around the monotonic one read both clocks at one moment. A thread switch between
# two reads (the GIL's 5 ms interval; longer when a loaded host preempts the daemon) would put a whole time slice
# between them, and every instant converted with that reading would be off by it.
PAIR_WITHIN = 100e-6
PAIR_ATTEMPTS = 5


class Now(NamedTuple):
    """One reading of both clocks."""

    wall: float  # Unix time on the node's clock
    monotonic: float  # seconds on a clock that only runs (not across a reboot; it stops in a suspend)

    def instant(self, unix_time: float) -> float:
        """A Unix time read on this node's wall clock (a client's stamp) as an instant on the monotonic clock."""
        return self.monotonic - (self.wall - unix_time)

    def unix(self, instant: float) -> float:
        """An instant on the monotonic clock as Unix time on the wall clock of this reading."""
        return self.wall - (self.monotonic - instant)


class Clock(Protocol):
    def read(self) -> Now: ...


class SystemClock:
    """The node's clocks: ``time.time()`` and ``time.monotonic()``, read as one pair."""

    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._wall = wall
        self._monotonic = monotonic

    def read(self) -> Now:
        """The monotonic clock between two readings of the wall clock, again while something came between them
        (a few times at most: then the closest pair)."""
        best: tuple[float, Now] | None = None
        for _ in range(PAIR_ATTEMPTS):
            before = self._wall()
            monotonic = self._monotonic()
            after = self._wall()
            gap = abs(after - before)  # negative only across a step of the wall clock
            if best is None or gap < best[0]:
                best = (gap, Now((before + after) / 2, monotonic))
            if gap <= PAIR_WITHIN:
                break
        assert best is not None
        return best[1]
