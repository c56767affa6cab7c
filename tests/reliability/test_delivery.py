"""Item 1: the client's totals arrive exactly once, whatever the daemon does mid-push.

The real client (fleetscope.client.StepTracker, its sender thread) pushes to a
real daemon that is stopped with SIGSTOP for longer than the client's timeout,
again and again: the client gives up on a batch the stopped daemon has already
read, and sends it again. The daemon must store every step once: before the
per-tracker session and the store's order per session, a 10 s stall turned
1,446 sent steps into 1,958 stored.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable

import pytest

from fleetscope.client import StepTracker
from tests.reliability.processes import Daemon

pytestmark = pytest.mark.live

TOKENS_PER_STEP = 7


def sample(text: str, name: str) -> float:
    match = re.search(rf'^{name}{{[^}}]*job="stalled"[^}}]*}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name} not exported"
    return float(match.group(1))


def stall(node: Daemon, stop: threading.Event, stopped: float, running: float) -> int:
    """SIGSTOP the daemon for ``stopped`` seconds every ``running`` seconds until ``stop``; returns the stalls."""
    assert node.process is not None
    stalls = 0
    while not stop.wait(running):
        os.kill(node.process.pid, signal.SIGSTOP)
        stalls += 1
        time.sleep(stopped)
        os.kill(node.process.pid, signal.SIGCONT)
    return stalls


@pytest.mark.parametrize(("stopped", "running"), [(3.0, 1.0), (1.5, 0.3)], ids=["long-stalls", "flapping"])
def test_stalled_daemon_stores_every_step_once(daemon: Callable[..., Daemon], stopped: float,
                                                running: float) -> None:
    node = daemon()
    tracker = StepTracker(job="stalled", rank=0, world_size=1, url=node.url, flush_interval=0.1, timeout=0.5,
                          batch_size=32, cuda_events=False, environ={})
    stop = threading.Event()
    stalls: list[int] = []
    staller = threading.Thread(target=lambda: stalls.append(stall(node, stop, stopped, running)))
    staller.start()
    steps = 0
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            with tracker.step(tokens=TOKENS_PER_STEP):
                time.sleep(0.002)
            steps += 1
    finally:
        stop.set()
        staller.join()
    assert node.process is not None
    os.kill(node.process.pid, signal.SIGCONT)
    tracker.close(timeout=120)  # a guard: the backlog drains in seconds, longer beside other tests
    stats = tracker.stats()
    assert stats.dropped == 0 and stats.rejected == 0 and stats.pending == 0, stats
    assert stats.failures > 0 and stalls[0] >= 2, "the stalls never made the client retry: the test proves nothing"
    _, _, body = node.get("/metrics")
    text = body.decode()
    assert sample(text, "fleetscope_training_steps_total") == steps
    assert sample(text, "fleetscope_training_tokens_total") == steps * TOKENS_PER_STEP
