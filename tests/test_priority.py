"""The suite's own CPU priorities (tests/conftest.py): fillers yield to the long units, long units get it back."""

from __future__ import annotations

import os

import pytest

from tests.conftest import FILLER_NICENESS, WORKER_NICENESS

IN_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))


def test_a_short_test_runs_at_the_fillers_priority_in_a_worker() -> None:
    assert os.nice(0) == (FILLER_NICENESS if IN_WORKER else WORKER_NICENESS)


@pytest.mark.slow
def test_a_long_test_runs_at_the_workers_own_priority() -> None:
    """Even after a short module ran on the same worker (its first-round look-ahead); without root the worker
    cannot raise its priority back and stays at the filler's."""
    if os.geteuid() == 0 or not IN_WORKER:
        assert os.nice(0) == WORKER_NICENESS
    else:
        assert os.nice(0) in (WORKER_NICENESS, FILLER_NICENESS)
