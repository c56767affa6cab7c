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
