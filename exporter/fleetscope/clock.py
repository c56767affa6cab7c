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
from typing import NamedTuple, Protocol


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
    """The node's clocks: ``time.time()`` and ``time.monotonic()``."""

    def read(self) -> Now:
        return Now(time.time(), time.monotonic())
