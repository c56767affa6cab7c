"""A clock pair for tests: time passes for both clocks; a wall-clock step moves only the wall clock."""

from __future__ import annotations

from fleetscope.clock import Now


class FakeClock:
    """``clock.now += 30`` lets 30 s pass; ``clock.step(-600)`` sets the wall clock back 600 s."""

    def __init__(self, wall: float = 1_000_000.0, monotonic: float = 5_000.0) -> None:
        self.wall = wall
        self.monotonic = monotonic

    @property
    def now(self) -> float:  # the wall clock, as most tests read it
        return self.wall

    @now.setter
    def now(self, wall: float) -> None:
        self.monotonic += wall - self.wall
        self.wall = wall

    def step(self, seconds: float) -> None:
        """Set the wall clock (NTP, ``date -s``): the monotonic clock does not move."""
        self.wall += seconds

    def read(self) -> Now:
        return Now(self.wall, self.monotonic)
