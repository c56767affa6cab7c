"""What a flood test watches while it floods: scrape latency, answers, and the daemon's memory."""

from __future__ import annotations

import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Self

from tests.reliability.processes import Daemon

# Prometheus's default scrape_timeout: a /metrics slower than this reads as the whole node down.
SCRAPE_TIMEOUT = 10.0


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
        self._thread.join(3 * SCRAPE_TIMEOUT)

    def _run(self) -> None:
        while not self._stop.is_set():
            for path in ("/metrics", "/healthz"):
                try:
                    took, status, _ = self.daemon.get(path, timeout=3 * SCRAPE_TIMEOUT)
                except OSError as exc:
                    self.failures.append(f"{path}: {exc}")
                    continue
                if status != 200:
                    self.failures.append(f"{path}: {status}")
                self.latencies.append(took)
            self._stop.wait(0.2)

    def check(self) -> None:
        if self.latencies:
            ordered = sorted(self.latencies)
            print(f"scrapes {len(ordered)}: median {ordered[len(ordered) // 2]:.3f}s, "
                  f"max {ordered[-1]:.3f}s")
        assert not self.failures, self.failures[:5]
        assert self.latencies, "no scrape finished during the flood"
        assert max(self.latencies) < SCRAPE_TIMEOUT, sorted(self.latencies)[-5:]


def room_for_sockets(count: int) -> None:
    """Let this test process hold ``count`` sockets (the soft open-files limit up to the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 256
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            raise RuntimeError(f"the open files limit ({hard}) cannot hold {count} sockets")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def settle(seconds: float) -> None:
    time.sleep(seconds)
