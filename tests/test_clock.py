from __future__ import annotations

import pytest

from fleetscope.clock import Now, SystemClock


def test_a_unix_time_and_its_monotonic_instant_convert_both_ways_on_one_reading() -> None:
    now = Now(wall=1_700_000_000.0, monotonic=500.0)
    assert now.instant(1_699_999_990.0) == 490.0
    assert now.unix(490.0) == 1_699_999_990.0


def test_after_a_step_of_the_wall_clock_an_instant_reads_as_the_same_age() -> None:
    before = Now(wall=1_700_000_000.0, monotonic=500.0)
    instant = before.instant(before.wall - 3)
    after = Now(wall=before.wall - 600 + 10, monotonic=510.0)  # set back 600 s, 10 s later
    assert after.wall - after.unix(instant) == 13.0


def test_the_system_clock_reads_both_clocks() -> None:
    import time

    first = SystemClock().read()
    assert first.wall == pytest.approx(time.time(), abs=5)
    assert SystemClock().read().monotonic >= first.monotonic


def test_the_two_clocks_are_read_at_one_moment_even_when_a_thread_switch_comes_between_them() -> None:
    # The first attempt is cut by 8 ms (another thread took the GIL between the reads), the second is not.
    walls = iter([1_700_000_000.000, 1_700_000_000.008, 1_700_000_000.010, 1_700_000_000.01001])
    monotonics = iter([500.000, 500.0100])
    now = SystemClock(wall=lambda: next(walls), monotonic=lambda: next(monotonics)).read()
    assert now.monotonic == 500.0100
    assert now.wall == pytest.approx(1_700_000_000.010005, abs=1e-6)


def test_a_clock_pair_that_is_never_read_cleanly_keeps_its_closest_attempt() -> None:
    gaps = [0.009, 0.004, 0.007, 0.006, 0.008]
    walls = iter(w for gap in gaps for w in (100.0, 100.0 + gap))
    monotonics = iter(range(5))
    now = SystemClock(wall=lambda: next(walls), monotonic=lambda: float(next(monotonics))).read()
    assert (now.wall, now.monotonic) == (pytest.approx(100.002), 1.0)
