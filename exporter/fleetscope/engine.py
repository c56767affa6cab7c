"""The collection engine: background collection, served from the latest readings.

Each background collector runs on its own thread at its own interval. One
attempt runs on a worker thread and is waited for at most ``timeout``
seconds; a call that never returns (a wedged driver, a blocking sysfs read)
leaves that worker stuck, the collector reports failure, and no second
attempt is stacked on top of it until the first one returns. ``/metrics``
only ever reads the latest completed :class:`Reading`, so a slow source can
neither delay nor fail a scrape. Readings older than the staleness bound are
dropped rather than served forever.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.core import Metric

from fleetscope import __version__
from fleetscope.errors import NoHardware
from fleetscope.families import FamilyBuilder
from fleetscope.metrics.engine import (
    BUILD_INFO,
    COLLECTOR_DURATION_SECONDS,
    COLLECTOR_HARDWARE_PRESENT,
    COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS,
    COLLECTOR_SUCCESS,
)

logger = logging.getLogger("fleetscope.engine")

Status = Literal["pending", "ok", "no_hardware", "failed", "timeout"]

@dataclass
class Reading:
    """The outcome of one collection attempt."""

    status: Status = "pending"
    metrics: list[Metric] = field(default_factory=list)
    started: float = 0.0
    duration: float = 0.0
    error: str = ""


Encoder = Callable[[Any], bytes]
OPENMETRICS_EOF = b"# EOF\n"


class _Fixed:
    """A fixed list of families, in the shape the exposition encoders read."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics


class _Attempt:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reading: Reading | None = None
        self.gave_up = False


class CollectorRunner:
    """Runs one collector in the background and keeps its latest reading."""

    def __init__(
        self,
        name: str,
        collector: Any,
        interval: float,
        timeout: float,
        staleness: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.collector = collector
        self.interval = interval
        self.timeout = timeout
        self.staleness = staleness
        self._clock = clock
        self._lock = threading.Lock()
        self._reading = Reading()
        self._last_success: float | None = None
        self._last_good: list[Metric] = []
        # Rendered exposition of _last_good per content type: a reading is rendered once,
        # not on every scrape (rendering dominates a scrape's cost).
        self._rendered: tuple[list[Metric], dict[str, bytes]] = ([], {})
        self._hardware_present = True
        self._worker: threading.Thread | None = None
        self._worker_started = 0.0
        self._stop = threading.Event()
        self._first_done = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"collector-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def wait_first(self, timeout: float | None = None) -> bool:
        return self._first_done.wait(timeout)

    @property
    def attempted(self) -> bool:
        return self._first_done.is_set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.run_once()
            elapsed = time.monotonic() - started
            self._stop.wait(max(0.0, self.interval - elapsed))

    # -- one attempt ---------------------------------------------------------------------------

    def run_once(self) -> Reading:
        """Run one attempt, waiting at most ``timeout``; returns the reading it recorded."""
        if self._worker is not None and self._worker.is_alive():
            # The previous attempt is still stuck: do not pile another one on the same source.
            stuck_for = time.monotonic() - self._worker_started
            reading = Reading("timeout", [], self._clock(), stuck_for, f"still running after {stuck_for:.1f}s")
            self._record(reading)
            return reading
        attempt = _Attempt()
        self._worker_started = time.monotonic()
        self._worker = threading.Thread(target=self._attempt, args=(attempt,), name=f"collect-{self.name}", daemon=True)
        self._worker.start()
        self._worker.join(self.timeout)
        with attempt.lock:
            reading = attempt.reading
            if reading is None:
                attempt.gave_up = True
                reading = Reading("timeout", [], self._clock(), self.timeout, f"timed out after {self.timeout}s")
                logger.error("collector %s timed out after %.1fs", self.name, self.timeout)
        self._record(reading)
        return reading

    def _attempt(self, attempt: _Attempt) -> None:
        started_wall = self._clock()
        started = time.perf_counter()
        try:
            metrics = list(self.collector.collect())
            reading = Reading("ok", metrics, started_wall, time.perf_counter() - started)
        except NoHardware as exc:
            logger.debug("collector %s: no hardware: %s", self.name, exc)
            reading = Reading("no_hardware", [], started_wall, time.perf_counter() - started, str(exc))
        except Exception as exc:  # one failing source must never take the daemon down
            logger.error("collector %s failed: %s", self.name, exc, exc_info=logger.isEnabledFor(logging.DEBUG))
            reading = Reading("failed", [], started_wall, time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
        with attempt.lock:
            attempt.reading = reading
            late = attempt.gave_up
        if late and reading.status != "failed":
            # The source came back after its timeout: its result is still the newest truth.
            self._record(reading)

    def _record(self, reading: Reading) -> None:
        with self._lock:
            self._reading = reading
            if reading.status == "ok":
                self._last_success = reading.started + reading.duration
                self._last_good = reading.metrics
                self._hardware_present = True
            elif reading.status == "no_hardware":
                self._last_success = reading.started + reading.duration
                self._last_good = []
                self._hardware_present = False
        self._first_done.set()

    # -- serving -------------------------------------------------------------------------------

    def snapshot(self) -> tuple[Reading, list[Metric], float | None, bool]:
        """(latest reading, metrics fit to serve, last success time, hardware present)."""
        with self._lock:
            fresh = self._last_success is not None and self._clock() - self._last_success <= self.staleness
            metrics = self._last_good if fresh else []
            return self._reading, metrics, self._last_success, self._hardware_present

    def rendered(self, metrics: list[Metric], encoder: Encoder, content_type: str) -> bytes:
        """The exposition of ``metrics`` (from :meth:`snapshot`), cached per reading."""
        if not metrics:
            return b""
        cached_for, by_type = self._rendered
        if cached_for is not metrics:
            by_type = {}
            self._rendered = (metrics, by_type)
        text = by_type.get(content_type)
        if text is None:
            text = by_type[content_type] = encoder(_Fixed(metrics))
        return text


class LiveCollector:
    """A collector over in-memory state, read at scrape time (it must be cheap)."""

    def __init__(self, name: str, collector: Any, clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.collector = collector
        self._clock = clock
        self.attempted = True

    def snapshot(self) -> tuple[Reading, list[Metric], float | None, bool]:
        started = self._clock()
        t0 = time.perf_counter()
        try:
            metrics = list(self.collector.collect())
        except Exception as exc:
            logger.error("collector %s failed: %s", self.name, exc)
            return Reading("failed", [], started, time.perf_counter() - t0, str(exc)), [], None, True
        reading = Reading("ok", metrics, started, time.perf_counter() - t0)
        return reading, metrics, started, True

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def wait_first(self, timeout: float | None = None) -> bool:
        return True

    def rendered(self, metrics: list[Metric], encoder: Encoder, content_type: str) -> bytes:
        return encoder(_Fixed(metrics)) if metrics else b""


class Engine:
    """All collectors of the daemon; also the ``prometheus_client`` collector for ``/metrics``."""

    def __init__(self, runners: Iterable[CollectorRunner | LiveCollector]) -> None:
        self.runners = list(runners)

    def start(self) -> None:
        for runner in self.runners:
            runner.start()

    def stop(self) -> None:
        for runner in self.runners:
            runner.stop()
        for runner in self.runners:
            close = getattr(runner.collector, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:  # closing is best effort at shutdown
                    logger.debug("closing collector %s: %s", runner.name, exc)

    def ready(self) -> bool:
        return all(runner.attempted for runner in self.runners)

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for runner in self.runners:
            if not runner.wait_first(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def _snapshots(self) -> tuple[list[Metric], list[tuple[CollectorRunner | LiveCollector, list[Metric]]]]:
        """Self-metrics for every collector, and each collector's servable metrics."""
        builder = FamilyBuilder()
        served: list[tuple[CollectorRunner | LiveCollector, list[Metric]]] = []
        for runner in self.runners:
            reading, metrics, last_success, present = runner.snapshot()
            served.append((runner, metrics))
            if reading.status == "pending":
                continue
            labels = (runner.name,)
            success = reading.status in ("ok", "no_hardware")
            builder.add(COLLECTOR_SUCCESS, labels, 1 if success else 0)
            builder.add(COLLECTOR_DURATION_SECONDS, labels, reading.duration)
            builder.add(COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS, labels, last_success)
            builder.add(COLLECTOR_HARDWARE_PRESENT, labels, 1 if present else 0)
        builder.add_info(BUILD_INFO, (), {"version": __version__, "python": platform.python_version()})
        return builder.families(), served

    def collect(self) -> Iterable[Metric]:
        own, served = self._snapshots()
        yield from own
        for _, metrics in served:
            yield from metrics

    def render(self, encoder: Encoder, content_type: str) -> bytes:
        """The whole exposition: self-metrics rendered now, readings from each runner's cache.

        Collectors export disjoint metric names, so their renderings concatenate into one
        valid exposition; OpenMetrics gets its single ``# EOF`` at the very end.
        """
        own, served = self._snapshots()
        chunks = [encoder(_Fixed(own))]
        chunks += [runner.rendered(metrics, encoder, content_type) for runner, metrics in served]
        if content_type.startswith("application/openmetrics-text"):
            chunks = [chunk.removesuffix(OPENMETRICS_EOF) for chunk in chunks]
            chunks.append(OPENMETRICS_EOF)
        return b"".join(chunks)
