"""The collection engine: background collection, served from the latest collections.

Each background collector runs on its own thread at its own interval. One
attempt runs on a worker thread and is waited for at most ``timeout``
seconds; a call that never returns (a wedged driver, a blocking sysfs read)
leaves that worker stuck, the collector reports failure, and no second
attempt is stacked on top of it until the first one returns. ``/metrics``
only ever reads the latest completed :class:`Collection`, so a slow source can
neither delay nor fail a scrape. Collections older than the staleness bound are
dropped rather than served forever.

A scrape costs what changed since the last one: each collection is rendered, in
the formats scrapers have been asking for, by its collector's thread before it
is published (:mod:`fleetscope.serve.exposition`), so ``/metrics`` joins bytes. Work
nothing reads is not done: a collector nobody has scraped for ``idle_after``
(setting ``collection.pause-after``) pauses until the next scrape, which waits
(at most the collector's timeout) for a fresh collection.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PrometheusCollector

from fleetscope import __version__
from fleetscope.collectors.protocol import Closeable, Collector, Versioned
from fleetscope.errors import Incomplete, NoHardware
from fleetscope.metrics.engine import (
    BUILD_INFO,
    COLLECTOR_DURATION_SECONDS,
    COLLECTOR_HARDWARE_PRESENT,
    COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS,
    COLLECTOR_SUCCESS,
)
from fleetscope.metrics.families import FamilyBuilder
from fleetscope.serve.exposition import EMPTY, Chunk, Format, Renderer, assemble

logger = logging.getLogger(__name__)

# partial: the collector raised Incomplete; what it could read is served, and it counts as a failure.
CollectionStatus = Literal["pending", "ok", "partial", "no_hardware", "failed", "timeout"]
SERVABLE = ("ok", "partial")

# Prometheus's lookback window: a target not scraped for this long has left every query's view,
# so collections taken for it are work nothing reads.
IDLE_AFTER = 300.0
MAX_FORMATS = 8  # formats rendered ahead per collection; scrapers ask for one or two


@dataclass
class Collection:
    """The outcome of one collection attempt: its status and, if fit to serve, the families it made.

    (A *reading* is a source's typed output, which a collector maps to these families.)"""

    status: CollectionStatus = "pending"
    metrics: list[Metric] = field(default_factory=list)
    started: float = 0.0
    duration: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class Served:
    """What one collector contributes to a scrape: its self-metric facts and its rendered series."""

    collection: Collection
    last_success: float | None
    hardware_present: bool
    chunk: Chunk


class _Rendered:
    """A list of families and its chunks, per format (``Content-Type``), filled as formats are asked for."""

    def __init__(self, metrics: list[Metric], renderer: Renderer) -> None:
        self.metrics = metrics
        self.renderer = renderer
        self.chunks: dict[str, Chunk] = {}

    def chunk(self, fmt: Format, owner: str) -> Chunk:
        chunk = self.chunks.get(fmt.content_type)
        if chunk is None:
            try:
                chunk = self.renderer.render(self.metrics, fmt)
            except Exception as exc:  # families one encoder refuses must not fail the whole scrape
                logger.error("collector %s: cannot render its series as %s: %s", owner, fmt.content_type, exc)
                return EMPTY
            self.chunks[fmt.content_type] = chunk
        return chunk


class _Attempt:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.collection: Collection | None = None
        self.gave_up = False


class CollectorRunner:
    """Runs one collector in the background and keeps its latest collection, rendered.

    ``pausable=False`` keeps collecting without scrapers: for a collector that
    follows an event stream (the kernel log) that would overrun while paused.
    ``timeout=None`` runs each attempt in the calling thread, without a deadline: only for a caller that owns
    the clock (the simulator's virtual-time run calls :meth:`run_once` itself, and a thread started and
    joined per collection was an eighth of its CPU); a daemon always has a timeout.
    """

    def __init__(
        self,
        name: str,
        collector: Collector,
        interval: float,
        timeout: float | None,
        staleness: float,
        clock: Callable[[], float] = time.time,
        idle_after: float = IDLE_AFTER,
        pausable: bool = True,
    ) -> None:
        self.name = name
        self.collector = collector
        self.interval = interval
        self.timeout = timeout
        self.staleness = staleness
        self.idle_after = idle_after
        self.pausable = pausable
        self._clock = clock
        self._lock = threading.Condition()
        self._collection = Collection()
        self._last_success: float | None = None
        self._last_served: float | None = None  # the newest collection fit to serve (ok, partial, no hardware)
        self._renderer = Renderer()  # only the thread that publishes a collection renders ahead of scrapes
        self._rendered = _Rendered([], self._renderer)
        self._hardware_present = True
        # Formats scrapers asked for: Content-Type -> (format, when last asked, gzip wanted).
        self._demand: dict[str, tuple[Format, float, bool]] = {}
        self._last_scrape = time.monotonic()  # a new daemon collects for IDLE_AFTER before it may pause
        self._paused = False
        self._resuming = False  # woken by a scrape, its first collection since the pause not yet recorded
        self._wake = threading.Event()
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
        self._wake.set()

    def wait_first(self, timeout: float | None = None) -> bool:
        return self._first_done.wait(timeout)

    @property
    def attempted(self) -> bool:
        return self._first_done.is_set()

    @property
    def paused(self) -> bool:
        return self._paused

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.run_once()
            elapsed = time.monotonic() - started
            self._stop.wait(max(0.0, self.interval - elapsed))
            if self.pausable:
                self._pause_while_unscraped()

    def _unscraped(self) -> bool:
        return time.monotonic() - self._last_scrape > self.idle_after

    def _pause_while_unscraped(self) -> None:
        while not self._stop.is_set() and self._unscraped():
            self._wake.clear()
            self._paused = True
            if not self._unscraped():  # a scrape came between the check and the flag
                break
            self._wake.wait()
        self._paused = False

    # -- one attempt ---------------------------------------------------------------------------

    def run_once(self) -> Collection:
        """Run one attempt, waiting at most ``timeout`` (None: in this thread); returns the collection it recorded."""
        if self.timeout is None:
            attempt = _Attempt()
            self._attempt(attempt)
            assert attempt.collection is not None  # _attempt records every outcome, an exception included
            self._record(attempt.collection)
            return attempt.collection
        if self._worker is not None and self._worker.is_alive():
            # The previous attempt is still stuck: do not pile another one on the same source.
            stuck_for = time.monotonic() - self._worker_started
            stuck = Collection("timeout", [], self._clock(), stuck_for, f"still running after {stuck_for:.1f}s")
            self._record(stuck)
            return stuck
        attempt = _Attempt()
        self._worker_started = time.monotonic()
        self._worker = threading.Thread(target=self._attempt, args=(attempt,), name=f"collect-{self.name}", daemon=True)
        self._worker.start()
        self._worker.join(self.timeout)
        with attempt.lock:
            finished = attempt.collection
            if finished is None:
                attempt.gave_up = True
                finished = Collection("timeout", [], self._clock(), self.timeout, f"timed out after {self.timeout}s")
                logger.error("collector %s timed out after %.1fs", self.name, self.timeout)
        self._record(finished)
        return finished

    def _attempt(self, attempt: _Attempt) -> None:
        started_wall = self._clock()
        started = time.perf_counter()
        try:
            metrics = list(self.collector.collect())
            collection = Collection("ok", metrics, started_wall, time.perf_counter() - started)
        except NoHardware as exc:
            logger.debug("collector %s: no hardware: %s", self.name, exc)
            collection = Collection("no_hardware", [], started_wall, time.perf_counter() - started, str(exc))
        except Incomplete as exc:
            logger.warning("collector %s read only in part: %s", self.name, exc)
            collection = Collection("partial", list(exc.metrics), started_wall, time.perf_counter() - started, str(exc))
        except Exception as exc:  # one failing source must never take the daemon down
            logger.error("collector %s failed: %s", self.name, exc, exc_info=logger.isEnabledFor(logging.DEBUG))
            collection = Collection("failed", [], started_wall, time.perf_counter() - started,
                                    f"{type(exc).__name__}: {exc}")
        with attempt.lock:
            attempt.collection = collection
            late = attempt.gave_up
        if late and collection.status != "failed":
            # The source came back after its timeout: its result is still the newest truth.
            self._record(collection)

    def _prerender(self, metrics: list[Metric]) -> _Rendered:
        """The new collection rendered in every format asked for lately, before anyone can be served it."""
        rendered = _Rendered(metrics, self._renderer)
        now = time.monotonic()
        for fmt, asked, compressed in list(self._demand.values()):
            if now - asked <= self.idle_after:
                chunk = rendered.chunk(fmt, self.name)
                if compressed:
                    chunk.deflated()
        return rendered

    def _record(self, collection: Collection) -> None:
        rendered = self._prerender(collection.metrics) if collection.status in SERVABLE else None
        with self._lock:
            self._collection = collection
            if collection.status in SERVABLE:
                if collection.status == "ok":
                    self._last_success = collection.started + collection.duration
                self._last_served = collection.started + collection.duration
                self._rendered = rendered or _Rendered(collection.metrics, self._renderer)
                self._hardware_present = True
            elif collection.status == "no_hardware":
                self._last_success = self._last_served = collection.started + collection.duration
                self._rendered = _Rendered([], self._renderer)
                self._hardware_present = False
            self._resuming = False
            self._lock.notify_all()
        self._first_done.set()

    # -- serving -------------------------------------------------------------------------------

    def _fresh(self) -> bool:
        return self._last_served is not None and self._clock() - self._last_served <= self.staleness

    def snapshot(self) -> tuple[Collection, list[Metric], float | None, bool]:
        """(latest collection, metrics fit to serve, last success time, hardware present)."""
        with self._lock:
            metrics = self._rendered.metrics if self._fresh() else []
            return self._collection, metrics, self._last_success, self._hardware_present

    def demand(self, fmt: Format, compressed: bool) -> None:
        """Note a scrape asking for ``fmt``; wake the collector if it paused."""
        now = time.monotonic()
        self._last_scrape = now
        previous = self._demand.pop(fmt.content_type, None)
        still_compressed = previous is not None and previous[2] and now - previous[1] <= self.idle_after
        self._demand[fmt.content_type] = (fmt, now, compressed or still_compressed)
        while len(self._demand) > MAX_FORMATS:  # a client can name any version: keep the latest few
            self._demand.pop(next(iter(self._demand)), None)
        if self._paused:
            self._resuming = True
            self._wake.set()

    @property
    def resuming(self) -> bool:
        """Woken from a pause and still without a collection fit to serve: a scrape should wait for one."""
        with self._lock:
            return self._resuming and not self._fresh()

    def wait_fresh(self) -> None:
        """After a pause: wait (at most the collector's timeout) until there is a collection fit to serve."""
        if self.timeout is None:  # its caller runs every attempt itself: none would come while it waited
            return
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while not self._fresh() and not self._stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._lock.wait(remaining)

    def ready_to_serve(self, fmt: Format) -> bool:
        """Whether :meth:`serve` would only hand out bytes (no rendering, no waiting)."""
        with self._lock:
            rendered = self._rendered if self._fresh() else None
        return rendered is None or not rendered.metrics or fmt.content_type in rendered.chunks

    def serve(self, fmt: Format) -> Served:
        """This collector's part of a scrape in ``fmt``: rendered once per collection."""
        with self._lock:
            collection, last_success, present = self._collection, self._last_success, self._hardware_present
            rendered = self._rendered if self._fresh() else None
        chunk = rendered.chunk(fmt, self.name) if rendered is not None else EMPTY
        return Served(collection, last_success, present, chunk)


class LiveCollector:
    """A collector over in-memory state, read at scrape time (it must be cheap).

    A :class:`~fleetscope.collectors.Versioned` collector (its ``generation()``
    changes whenever its series would) is collected and rendered again only
    when it changed.
    """

    pausable = False

    def __init__(self, name: str, collector: Collector, clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.collector = collector
        self._clock = clock
        self._generation_of = collector.generation if isinstance(collector, Versioned) else None
        self._cached: tuple[object, Collection, _Rendered] | None = None
        self._renderer = Renderer()
        self.attempted = True

    def _collect(self) -> Collection:
        started = self._clock()
        t0 = time.perf_counter()
        try:
            metrics = list(self.collector.collect())
        except Incomplete as exc:
            return Collection("partial", list(exc.metrics), started, time.perf_counter() - t0, str(exc))
        except Exception as exc:
            logger.error("collector %s failed: %s", self.name, exc)
            return Collection("failed", [], started, time.perf_counter() - t0, str(exc))
        return Collection("ok", metrics, started, time.perf_counter() - t0)

    def snapshot(self) -> tuple[Collection, list[Metric], float | None, bool]:
        collection = self._collect()
        return collection, collection.metrics, collection.started if collection.status == "ok" else None, True

    def serve(self, fmt: Format) -> Served:
        generation = self._generation_of() if self._generation_of is not None else None
        cached = self._cached
        if generation is None or cached is None or cached[0] != generation:
            collection = self._collect()
            cached = (generation, collection, _Rendered(collection.metrics, self._renderer))
            if generation is not None and collection.status == "ok":
                self._cached = cached
        _, collection, rendered = cached
        last_success = self._clock() if collection.status == "ok" else None  # in-memory state is current
        return Served(collection, last_success, True, rendered.chunk(fmt, self.name))

    resuming = False

    def demand(self, fmt: Format, compressed: bool) -> None:
        pass

    def wait_fresh(self) -> None:
        pass

    def ready_to_serve(self, fmt: Format) -> bool:
        return True  # in-memory state, rendered from its last template: cheap enough for any caller

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def wait_first(self, timeout: float | None = None) -> bool:
        return True


def _self_families(named: Sequence[tuple[str, Collection, float | None, bool]]) -> list[Metric]:
    builder = FamilyBuilder()
    for name, collection, last_success, present in named:
        if collection.status == "pending":
            continue
        labels = (name,)
        builder.add(COLLECTOR_SUCCESS, labels, 1 if collection.status in ("ok", "no_hardware") else 0)
        builder.add(COLLECTOR_DURATION_SECONDS, labels, collection.duration)
        builder.add(COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS, labels, last_success)
        builder.add(COLLECTOR_HARDWARE_PRESENT, labels, 1 if present else 0)
    builder.add_info(BUILD_INFO, (), {"version": __version__, "python": platform.python_version()})
    return builder.families()


class Engine(PrometheusCollector):
    """All collectors of the daemon; also the ``prometheus_client`` collector for tools and tests."""

    def __init__(
        self, runners: Iterable[CollectorRunner | LiveCollector], process: PrometheusCollector | None = None
    ) -> None:
        self.runners = list(runners)
        # Self-metrics rendered per format, reused while no collector's facts changed.
        self._own: dict[str, tuple[tuple[object, ...], Chunk]] = {}
        self._own_renderer = Renderer()
        # The serving process's own figures (prometheus_client's process_* metrics), read at every scrape.
        self.process = process
        self._process_renderer = Renderer()

    def start(self) -> None:
        for runner in self.runners:
            runner.start()

    def stop(self) -> None:
        for runner in self.runners:
            runner.stop()
        for runner in self.runners:
            if isinstance(runner.collector, Closeable):
                try:
                    runner.collector.close()
                except Exception as exc:  # closing is best effort at shutdown
                    logger.debug("closing collector %s: %s", runner.name, exc)

    def ready(self) -> bool:
        return all(runner.attempted for runner in self.runners)

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(runner.wait_first(max(0.0, deadline - time.monotonic())) for runner in self.runners)

    def collect(self) -> Iterable[Metric]:
        """Self-metrics, then every collector's servable series (the registry path: tools and tests)."""
        snapshots = [(runner.name, runner.snapshot()) for runner in self.runners]
        yield from _self_families([(name, done, last, present) for name, (done, _, last, present) in snapshots])
        if self.process is not None:
            yield from self.process.collect()
        for _, (_, metrics, _, _) in snapshots:
            yield from metrics

    def exposition(self, fmt: Format, compressed: bool, block: bool = True) -> bytes | None:
        """The ``/metrics`` body in ``fmt``, gzip-framed when ``compressed``.

        Collectors export disjoint metric names, so their chunks join into one
        valid exposition, self-metrics first. With ``block=False`` it returns None
        instead of rendering a background collection or waiting for a paused collector
        (so an event loop can hand that case to a thread).
        """
        for runner in self.runners:
            runner.demand(fmt, compressed)
        waiting = [runner for runner in self.runners if runner.resuming]
        if not block and (waiting or not all(runner.ready_to_serve(fmt) for runner in self.runners)):
            return None
        for runner in waiting:
            runner.wait_fresh()
        served = [(runner.name, runner.serve(fmt)) for runner in self.runners]
        own = [self._own_chunk(served, fmt)]
        if self.process is not None:
            own.append(self._process_renderer.render(list(self.process.collect()), fmt))
        return assemble([*own, *(part.chunk for _, part in served)], fmt, compressed)

    def _own_chunk(self, served: Sequence[tuple[str, Served]], fmt: Format) -> Chunk:
        facts = [(name, part.collection, part.last_success, part.hardware_present) for name, part in served]
        key = tuple((name, done.status, done.duration, last, present) for name, done, last, present in facts)
        cached = self._own.get(fmt.content_type)
        if cached is not None and cached[0] == key:
            return cached[1]
        chunk = self._own_renderer.render(_self_families(facts), fmt)
        self._own[fmt.content_type] = (key, chunk)
        return chunk
