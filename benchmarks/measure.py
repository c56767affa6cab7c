"""The measurements: each function runs one part of the suite and returns plain results.

Every part starts its own processes and stops them again, so the parts are
independent; :mod:`benchmarks.run` calls them in order and hands the results
to :mod:`benchmarks.report`.
"""

from __future__ import annotations

import cProfile
import io
import json
import math
import os
import pstats
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import (
    ALL_COLLECTORS,
    PROMETHEUS_ACCEPT,
    NodeShape,
    PacedScraper,
    PushOutcome,
    RankFleet,
    Server,
    Services,
    SimTree,
    TreeTicker,
    cpu_share,
    daemon_service,
    metrics_text,
    push_load,
    pushgateway_service,
    sample_process,
    step_record,
)


@dataclass(frozen=True)
class Settings:
    """How long and how hard each part runs (``--quick`` shrinks everything for the smoke test)."""

    workdir: str
    sustained_seconds: float = 60.0
    scrape_interval: float = 15.0  # the production Prometheus scrape interval
    steps_per_second: float = 2.0  # per rank: a fast 0.5 s training step
    cycle_interval: float = 1.0  # collection interval of the daemon sampled for per-collector cycle times
    push_seconds: float = 5.0  # per push workload
    ingest_batch: int = 256  # the client's batch size (StepTracker(batch_size=256))
    client_calls: int = 20_000
    client_bursts: int = 20
    burst_requests: int = 5  # per rank, bodies near push.max-body-bytes
    node_exporter: str | None = "/usr/bin/prometheus-node-exporter"
    pushgateway: str | None = "/usr/bin/prometheus-pushgateway"

    @classmethod
    def quick(cls, workdir: str) -> Settings:
        return cls(workdir, sustained_seconds=2.0, scrape_interval=1.0, cycle_interval=0.5, push_seconds=0.5,
                   client_calls=500, client_bursts=3, burst_requests=1)


# -- shared helpers ------------------------------------------------------------------------------


def parse_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def series_by_metric(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, _, _ in parse_samples(text):
        counts[name] = counts.get(name, 0) + 1
    return counts


def collector_of_metrics() -> dict[str, str]:
    """Exported sample name -> collector, from the metric tables (the catalog's source)."""
    from fleetscope.metrics import ALL_TABLES

    owner: dict[str, str] = {}
    for table in ALL_TABLES:
        for spec in table:
            owner.setdefault(spec.name, table.collector)  # names already carry their _total / _info suffix
    return owner


def owner_of(sample_name: str, owners: dict[str, str]) -> str:
    if sample_name in owners:
        return owners[sample_name]
    for suffix in ("_total", "_created", "_info", "_bucket", "_count", "_sum"):
        if sample_name.endswith(suffix) and sample_name.removesuffix(suffix) in owners:
            return owners[sample_name.removesuffix(suffix)]
    return "pushed groups" if not sample_name.startswith("fleetscope_") else "unmapped"


# -- 1, 2, 4: the node under production settings -----------------------------------------------


IDLE_LABEL = "p5, idle (no pushes, no scrapes)"
VARIANTS = (
    NodeShape("p5 (8 GPUs, 32 EFA, 4 ENA, 8 ranks)"),
    NodeShape(IDLE_LABEL, ranks=0),
    NodeShape("1 GPU", gpus=1),
    NodeShape("4 EFA devices", efa=4),
    NodeShape("1 rank", ranks=1),
    NodeShape("64 ranks", ranks=64),
)


@dataclass
class VariantResult:
    shape: NodeShape
    cpu_share: float
    peak_rss_bytes: int
    rss_bytes: int
    seconds: float
    scrapes: int
    pushes: dict[str, int]


@dataclass
class CycleStats:
    collector: str
    cycles: int
    median_seconds: float
    max_seconds: float


@dataclass
class NodeResults:
    variants: list[VariantResult]
    cycles: list[CycleStats]
    series: dict[str, int]  # collector -> series
    series_total: int
    largest_metrics: list[tuple[str, int]]
    ingest: PushOutcome
    exposition_bytes: int
    peak_rss_after_ingest: int = 0
    burst: PushOutcome | None = None  # 8 ranks at once, bodies near push.max-body-bytes
    burst_records_per_body: int = 0
    peak_rss_after_burst: int = 0


def _cycle_collector(samples: dict[str, dict[float, float]]) -> Any:
    """on_body hook: record (last success time -> duration) per collector; one key per cycle."""

    def on_body(body: bytes) -> None:
        durations: dict[str, float] = {}
        stamps: dict[str, float] = {}
        for name, labels, value in parse_samples(body.decode("utf-8")):
            if name == "fleetscope_collector_duration_seconds":
                durations[labels["collector"]] = value
            elif name == "fleetscope_collector_last_success_timestamp_seconds":
                stamps[labels["collector"]] = value
        for collector, duration in durations.items():
            if collector in stamps:
                samples.setdefault(collector, {})[stamps[collector]] = duration

    return on_body


def measure_node(settings: Settings, log: Any = print) -> NodeResults:
    """Sustained run of every variant side by side, then latency, series and ingest on the p5 node."""
    from fleetscope.config import PushConfig

    trees = [SimTree(shape, os.path.join(settings.workdir, f"node-{i}"), index=i, hard=True)
             for i, shape in enumerate(VARIANTS)]
    cycle_tree = SimTree(VARIANTS[0], os.path.join(settings.workdir, "node-cycles"), index=len(VARIANTS), hard=True)
    ticker = TreeTicker([*trees, cycle_tree], max_seconds=settings.sustained_seconds + 600)
    daemons = [daemon_service(f"daemon-{i}", tree.paths.root, settings.workdir, ALL_COLLECTORS)
               for i, tree in enumerate(trees)]
    cycle_daemon = daemon_service("daemon-cycles", cycle_tree.paths.root, settings.workdir,
                                  ALL_COLLECTORS, interval=str(settings.cycle_interval))
    fleets: list[RankFleet] = []
    scrapers: list[PacedScraper] = []
    cycle_samples: dict[str, dict[float, float]] = {}
    with Services() as services:
        log(f"  starting {len(daemons) + 1} node daemons")
        services.start(*daemons, cycle_daemon)
        ticker.start()
        try:
            for tree, daemon in zip(trees, daemons, strict=True):
                fleets.append(RankFleet(daemon.port, tree.shape.ranks, settings.steps_per_second))
                idle = tree.shape.label == IDLE_LABEL  # scraped once, before the window opens
                scrapers.append(PacedScraper(daemon.port, 1e6 if idle else settings.scrape_interval))
            fleets.append(RankFleet(cycle_daemon.port, 8, settings.steps_per_second))
            scrapers.append(PacedScraper(cycle_daemon.port, settings.cycle_interval / 2,
                                         on_body=_cycle_collector(cycle_samples)))
            for fleet in fleets:
                fleet.start()
            for scraper in scrapers:
                scraper.start()
            time.sleep(min(2.0, settings.sustained_seconds))  # first pushes land, senders settle
            log(f"  sustained run: {settings.sustained_seconds:.0f}s at default intervals")
            start = [sample_process(d.pid) for d in daemons]
            time.sleep(settings.sustained_seconds)
            end = [sample_process(d.pid) for d in daemons]
            for scraper in scrapers:
                scraper.stop()

            # Only the p5 node keeps its ranks pushing: the other variants would compete for the cores.
            pushes = [fleet.stop() for fleet in fleets[1:]]
            base = daemons[0]
            text = metrics_text(base.port)
            pushes.insert(0, fleets[0].stop())
            log("  ingest: 8 ranks, batched")
            ingest = push_load(base.port, 8, "post", settings.ingest_batch, 100_000, settings.push_seconds,
                               job="ingest")
            rss_after_ingest = sample_process(base.pid).hwm_bytes
            # The memory limit must survive the largest bodies the daemon accepts, 8 at a time.
            burst_batch = records_per_body(PushConfig().max_body_bytes)
            log(f"  burst: 8 ranks x {settings.burst_requests} bodies of {burst_batch} records (~1 MiB)")
            burst = push_load(base.port, 8, "post", burst_batch, settings.burst_requests, 60.0, job="burst")
            rss_after_burst = sample_process(base.pid).hwm_bytes
        finally:
            for scraper in scrapers:
                scraper.stop()
            for fleet in fleets:
                fleet.stop()
            ticker.stop()

    variants = [
        VariantResult(tree.shape, cpu_share(s0, s1), s1.hwm_bytes, s1.rss_bytes, s1.wall - s0.wall,
                      len(scraper.latencies) if tree.shape.label != IDLE_LABEL else 0, push)
        for tree, s0, s1, scraper, push in zip(trees, start, end, scrapers[: len(trees)], pushes[: len(trees)],
                                               strict=True)
    ]
    cycles = [
        CycleStats(name, len(by_stamp), statistics.median(by_stamp.values()), max(by_stamp.values()))
        for name, by_stamp in sorted(cycle_samples.items()) if by_stamp
    ]
    owners = collector_of_metrics()
    per_metric = series_by_metric(text)
    series: dict[str, int] = {}
    for name, count in per_metric.items():
        collector = owner_of(name, owners)
        series[collector] = series.get(collector, 0) + count
    largest = sorted(per_metric.items(), key=lambda item: -item[1])[:10]
    return NodeResults(variants, cycles, series, sum(per_metric.values()), largest, ingest, len(text.encode()),
                       rss_after_ingest, burst, burst_batch, rss_after_burst)


def records_per_body(limit: int) -> int:
    """How many step records fit in a JSON body of at most ``limit`` bytes (with a margin)."""
    one = len(json.dumps(step_record("burst", 7, 123456, 8))) + 2
    return max(1, int(limit * 0.95) // one)


# -- 3, 5b: push path ------------------------------------------------------------------------------


@dataclass
class PushRow:
    server: str
    workload: str
    outcome: PushOutcome
    server_cpu_seconds: float

    @property
    def cpu_us_per_record(self) -> float:
        return 1e6 * self.server_cpu_seconds / self.outcome.records if self.outcome.records else math.nan


@dataclass
class ClientCost:
    report_us: float  # tracker.report(...) per call, sender idle (the training-loop regime)
    step_us: float  # `with tracker.step(): with tracker.phase(...)` x3 per step, sender idle
    report_busy_us: float  # tracker.report in a tight loop, the sender thread posting alongside
    step_busy_us: float
    calls: int
    sent: int
    dropped: int


@dataclass
class PushResults:
    rows: list[PushRow]
    client: ClientCost
    ranks: int = 8
    note: str = ""

    def row(self, server: str, workload: str) -> PushRow | None:
        for row in self.rows:
            if row.server == server and row.workload == workload:
                return row
        return None


def _timed_push(service: Server, server: str, workload: str, mode: str, batch: int, settings: Settings,
                job: str) -> PushRow:
    s0 = sample_process(service.pid)
    outcome = push_load(service.port, 8, mode, batch, 1_000_000, settings.push_seconds, job=job)
    s1 = sample_process(service.pid)
    return PushRow(server, workload, outcome, s1.cpu_seconds - s0.cpu_seconds)


def _report(tracker: Any) -> None:
    tracker.report(0.5, data_seconds=0.01, compute_seconds=0.4, comm_seconds=0.09, tokens=32768, samples=8, loss=2.5)


def _timed_step(tracker: Any) -> None:
    with tracker.step(tokens=32768) as step:
        with tracker.phase("data"):
            pass
        with tracker.phase("compute"):
            pass
        with tracker.phase("comm"):
            pass
        step.loss = 2.5


def _per_call(call: Any, tracker: Any, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        call(tracker)
    return (time.perf_counter() - t0) / calls


def measure_client(port: int, calls: int, bursts: int = 20) -> ClientCost:
    """Cost in the training thread, in two regimes.

    Idle sender: bursts of 200 calls (below the 256-record batch, so the sender is not woken),
    with pauses between bursts for the sender to flush: a real loop's steps are far apart.
    Busy sender: ``calls`` calls back to back, the sender posting full batches alongside.
    Each figure is the median over bursts/repeats.
    """
    from fleetscope.client import StepTracker

    tracker = StepTracker(job="client-cost", rank=0, local_rank=0, world_size=1, gpu=0,
                          url=f"http://127.0.0.1:{port}", environ={})
    try:
        idle: dict[str, list[float]] = {"report": [], "step": []}
        for _ in range(bursts):
            for name, call in (("report", _report), ("step", _timed_step)):
                idle[name].append(_per_call(call, tracker, 100))
                time.sleep(0.15)
        busy_report = [_per_call(_report, tracker, calls) for _ in range(3)]
        busy_step = [_per_call(_timed_step, tracker, calls) for _ in range(3)]
    finally:
        tracker.close(timeout=5.0)
    stats = tracker.stats()
    return ClientCost(
        1e6 * statistics.median(idle["report"]), 1e6 * statistics.median(idle["step"]),
        1e6 * statistics.median(busy_report), 1e6 * statistics.median(busy_step),
        bursts * 200 + calls * 6, stats.sent, stats.dropped,
    )


def measure_push(settings: Settings, log: Any = print) -> PushResults:
    root = os.path.join(settings.workdir, "node-push")
    SimTree(NodeShape("push"), root, index=30, hard=True)  # the daemon needs a tree; only the push endpoint is used
    daemon = daemon_service("daemon-push", root, settings.workdir, ("steps",))
    services_list: list[Server] = [daemon]
    gateway = None
    if settings.pushgateway:
        gateway = pushgateway_service(settings.pushgateway, settings.workdir)
        services_list.append(gateway)
    rows: list[PushRow] = []
    with Services() as services:
        log("  starting fleetscope (push endpoint only) and the Pushgateway")
        services.start(*services_list)
        if gateway is not None:
            log("  Pushgateway: PUT per record")
            rows.append(_timed_push(gateway, "Pushgateway", "PUT per record", "put", 1, settings, "pg"))
        log("  fleetscope: PUT per record, POST per record, POST batched")
        rows.append(_timed_push(daemon, "fleetscope", "PUT per record", "put", 1, settings, "fs-put"))
        rows.append(_timed_push(daemon, "fleetscope", "POST per record", "post", 1, settings, "fs-post"))
        rows.append(_timed_push(daemon, "fleetscope", f"POST batched ({settings.ingest_batch})", "post",
                                settings.ingest_batch, settings, "fs-batch"))
        log("  client cost per step")
        client = measure_client(daemon.port, settings.client_calls, settings.client_bursts)
    note = "" if gateway else "Pushgateway binary not found: side by side skipped"
    return PushResults(rows, client, note=note)


# -- where the time goes ---------------------------------------------------------------------------


@dataclass
class ProfileResult:
    title: str
    calls: int
    seconds_per_call: float
    top: list[tuple[str, int, float, float]]  # function, calls, tottime s, cumtime s (per profiled call)
    cpu_seconds_per_call: float = math.nan  # thread CPU time, median


def _profile(title: str, work: Any, calls: int, top: int = 10) -> ProfileResult:
    work()  # warm caches and lazy imports
    plain = []
    cpu = []
    for _ in range(calls):  # timed without the profiler, which roughly doubles Python-heavy code
        t0, c0 = time.perf_counter(), time.thread_time()
        work()
        cpu.append(time.thread_time() - c0)  # this thread's CPU: unaffected by other processes' load
        plain.append(time.perf_counter() - t0)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        work()
    profiler.disable()
    elapsed = statistics.median(plain)
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (filename, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = filename
        for marker in ("site-packages/", "exporter/", "lib/python3.11/"):
            if marker in filename:
                where = filename.split(marker, 1)[1]
                break
        rows.append((f"{where}:{line}({func})", ncalls // calls, tottime / calls, cumtime / calls))
    rows.sort(key=lambda row: -row[2])
    return ProfileResult(title, calls, elapsed, rows[:top], statistics.median(cpu))


@dataclass
class Profiles:
    items: list[ProfileResult]


def _cpu_median(work: Any, calls: int) -> float:
    samples = []
    for _ in range(calls):
        c0 = time.thread_time()
        work()
        samples.append(time.thread_time() - c0)
    return statistics.median(samples)


def measure_profiles(settings: Settings, calls: int, log: Any = print) -> Profiles:
    """cProfile, in this process, of the p5 node's scrape path and of each background collector."""
    import json as jsonlib

    from benchmarks.nodeproc import node_flags
    from fleetscope.push.models import parse_records, reports_from_records
    from fleetscope.serve.daemon import build_engine
    from fleetscope.serve.engine import CollectorRunner
    from fleetscope.serve.exposition import negotiate, render
    from fleetscope_sim.gpufeed import GpuFeed
    from fleetscope_sim.nodeproc import build_node_collectors, node_config

    log("  profiling the scrape path and each collector in-process")
    tree = SimTree(VARIANTS[0], os.path.join(settings.workdir, "node-profile"), index=40, hard=True)
    tree.tick(1.0)
    config = node_config(tree.paths, "127.0.0.1:0", 15.0, node_flags(list(ALL_COLLECTORS), "default"))
    GpuFeed(tree.paths).install()
    collectors = build_node_collectors(config, tree.paths)
    engine = build_engine(config, collectors)
    if "steps" in collectors:
        records = [step_record("profile", r, s, 8) for r in range(8) for s in range(1, 33)]
        collectors["steps"].store.ingest(reports_from_records(parse_records(jsonlib.dumps(records).encode())))
    results = []
    for runner in engine.runners:
        if isinstance(runner, CollectorRunner):
            runner.run_once()
            results.append(_profile(f"collector {runner.name}: one collection", runner.collector.collect,
                                    max(3, calls // 3), top=6))
    om = negotiate(PROMETHEUS_ACCEPT)
    efa = next(r for r in engine.runners if r.name == "efa")
    assert isinstance(efa, CollectorRunner)
    metrics = efa.snapshot()[1]
    results.insert(0, _profile("one EFA reading rendered as OpenMetrics and deflated (once per reading)",
                               lambda: render(metrics, om).deflated(), calls))
    engine.exposition(om, compressed=True)  # the format is asked for: every background part is cached
    results.insert(1, _profile("one scrape: the cached parts, the live `steps` part and self-metrics, gzip-framed",
                               lambda: engine.exposition(om, compressed=True), calls))
    engine.stop()
    return Profiles(results)


def median_or_nan(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


@dataclass
class Environment:
    cpu_model: str
    cores: int
    cores_usable: int
    versions: dict[str, str] = field(default_factory=dict)
    load_before: str = ""
    load_after: str = ""


def load_average() -> str:
    """1, 5 and 15 minute load averages: how busy the machine was besides this suite."""
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return " / ".join(handle.read().split()[:3])
    except OSError:
        return "unknown"


def environment(settings: Settings) -> Environment:
    import platform
    import shutil
    from importlib import metadata

    from benchmarks.harness import binary_version

    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {"python": platform.python_version()}
    for package in ("fleetscope", "prometheus_client", "fastapi", "uvicorn", "pydantic", "uvloop", "httptools"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    versions["node_exporter"] = binary_version(settings.node_exporter) if settings.node_exporter else "not installed"
    versions["pushgateway"] = binary_version(settings.pushgateway) if settings.pushgateway else "not installed"
    prometheus = shutil.which("prometheus")
    versions["prometheus"] = binary_version(prometheus) if prometheus else "not installed"
    return Environment(model, os.cpu_count() or 0, len(os.sched_getaffinity(0)), versions, load_average())

