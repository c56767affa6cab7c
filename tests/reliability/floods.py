"""What a flood test watches while it floods: scrape latency, answers, and the daemon's memory."""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass, field
from typing import Self

from tests.reliability.processes import Daemon

# Prometheus's default scrape_timeout: a /metrics slower than this reads as the whole node down.
SCRAPE_TIMEOUT = 10.0
# How long one scrape may take before it counts as failed. Not SCRAPE_TIMEOUT itself: these floods run beside other
# tests on a loaded 2-core machine, where a scrape the daemon answers at once can still wait seconds for a core.
# The defects they guard against froze scrapes for good or for far longer (a held lock, 60 s; a 100 s push; a
# full accept queue, until the sockets close), so a scrape not answered in three timeouts is a real failure, and a
# slow one under load is not. Each latency is printed, to compare against docs/reliability.md's figures.
SCRAPE_LIMIT = 3 * SCRAPE_TIMEOUT


@dataclass
class Scraper:
    """GET /metrics (and /healthz) back to back on a thread while a flood runs."""

    daemon: Daemon
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(SCRAPE_LIMIT)

    def _run(self) -> None:
        while not self._stop.is_set():
            for path in ("/metrics", "/healthz"):
                try:
                    took, status, _ = self.daemon.get(path, timeout=SCRAPE_LIMIT)
                except OSError as exc:
                    self.failures.append(f"{path}: {exc}")
                    continue
                if status != 200:
                    self.failures.append(f"{path}: {status}")
                self.latencies.append(took)
            self._stop.wait(0.2)

    def scrapes(self) -> int:
        """Scrapes answered so far."""
        return len(self.latencies)

    def check(self) -> None:
        """Every scrape during the flood was answered (200, within SCRAPE_LIMIT) and at least one finished."""
        if self.latencies:
            ordered = sorted(self.latencies)
            print(f"scrapes {len(ordered)}: median {ordered[len(ordered) // 2]:.3f}s, "
                  f"max {ordered[-1]:.3f}s")
        assert not self.failures, self.failures[:5]
        assert self.latencies, "no scrape finished during the flood"


def room_for_sockets(count: int) -> None:
    """Let this test process hold ``count`` sockets (the soft open-files limit up to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 256
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            raise RuntimeError(f"the open files limit ({hard}) cannot hold {count} sockets")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))

