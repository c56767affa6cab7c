"""A training loop calling the client 100,000 times while the daemon is down or hangs.

No timing assertion here (speed claims belong in benchmarks); the test checks
that the loop completes, memory stays bounded by the buffer, and every record
is accounted for as dropped or still pending.
"""

from __future__ import annotations

import socket
import time
import tracemalloc
from collections.abc import Iterator

import pytest

from fleetscope.client import StepTracker
from tests.conftest import free_port

CALLS = 100_000
CAPACITY = 2_000


@pytest.fixture(params=["refused", "hanging"])
def dead_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "refused":
        yield f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
        return
    # Listens but never accepts: connections queue in the backlog and requests time out.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_loop_is_not_held_up_and_memory_is_bounded(dead_url: str) -> None:
    tracker = StepTracker(
        job="down",
        rank=0,
        url=dead_url,
        environ={},
        capacity=CAPACITY,
        batch_size=256,
        flush_interval=0.05,
        timeout=0.2,
    )
    tracemalloc.start()
    try:
        started = time.perf_counter()
        for step in range(CALLS // 2):
            with tracker.step(tokens=10), tracker.phase("compute"):
                pass
            if step == 10_000:
                after_warmup, _ = tracemalloc.get_traced_memory()
        for _ in range(CALLS // 2):
            tracker.report(0.1, data_seconds=0.01, loss=1.0)
        elapsed = time.perf_counter() - started
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    stats = tracker.stats()
    tracker.close(timeout=2)
    # Everything is accounted for: nothing was delivered, and what is not pending was dropped.
    assert stats.enqueued == CALLS and stats.sent == 0 and stats.rejected == 0
    assert stats.dropped + stats.pending == CALLS
    assert stats.pending <= CAPACITY + 256
    assert stats.dropped >= CALLS - CAPACITY - 256
    # Bounded: 90,000 more records after warm-up add no more than one buffer's worth of memory.
    one_buffer = peak / 2 if peak else 0
    assert current - after_warmup < max(one_buffer, 2_000_000)
    assert peak < 16_000_000
    print(
        f"\n{dead_url}: {elapsed / CALLS * 1e6:.2f} us per call under tracemalloc, peak {peak / 1e6:.1f} MB"
    )
