"""Scrape cost, measured the way production scrapes (issue #16).

Every part scrapes with Prometheus's own request (its Accept and Accept-Encoding
headers, a kept-alive connection, one scrape per interval) on the harder node of
#16 (:class:`benchmarks.harness.SimTree` with ``hard=True``), and puts fleetscope
beside node_exporter on the same tree in the same run:

* :func:`measure_side_by_side`: node_exporter, fleetscope with the network
  collectors (what #16 compared) and fleetscope with every collector while 8
  ranks push 10 steps/s each, scraped every 2 s; repeated, for the spread;
* :func:`measure_prometheus`: the same pair scraped by a real Prometheus, read
  back from its own ``scrape_duration_seconds``;
* :func:`measure_idle`: the daemon's CPU with no scraper, one and two scrapers;
* :func:`measure_scrape_path`: what one scrape and one reading cost, part by part.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import (
    ALL_COLLECTORS,
    NET_COLLECTORS,
    PROMETHEUS_3_ACCEPT,
    PROMETHEUS_ACCEPT,
    KeepAliveClient,
    NodeShape,
    PacedScraper,
    RankFleet,
    Server,
    Services,
    SimTree,
    TreeTicker,
    daemon_service,
    metrics_text,
    node_exporter_service,
    percentile,
    sample_process,
    scrape_headers,
)

Log = Callable[[str], None]


@dataclass(frozen=True)
class ScrapeSettings:
    """How long and how hard the scrape measurements run (``quick`` shrinks them for the smoke test)."""

    workdir: str
    interval: float = 2.0  # the scrape interval of #16's measurement
    seconds: float = 120.0  # measured window of one side-by-side run
    repeats: int = 3
    ranks: int = 8
    steps_per_second: float = 10.0  # per rank, while the full daemon is scraped
    prometheus_seconds: float = 90.0
    idle_seconds: float = 60.0
    pause_after: float = 20.0  # collection.pause-after of the idle variants (the daemon's default is 300 s)
    requests: int = 400  # back-to-back requests per row of the per-request cost table
    calls: int = 30  # in-process repetitions per cost
    node_exporter: str | None = "/usr/bin/prometheus-node-exporter"

    @classmethod
    def quick(cls, workdir: str, node_exporter: str | None) -> ScrapeSettings:
        return cls(workdir, interval=0.5, seconds=2.0, repeats=1, prometheus_seconds=3.0, idle_seconds=1.0,
                   pause_after=1.0, requests=20, calls=3, node_exporter=node_exporter)


def hard_tree(settings: ScrapeSettings, name: str, index: int) -> SimTree:
    """The node of #16, with the files node_exporter's infiniband collector insists on."""
    tree = SimTree(NodeShape("p5, #16"), os.path.join(settings.workdir, name), index=index, hard=True)
    tree.add_node_exporter_shim()
    return tree


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


# -- side by side ----------------------------------------------------------------------------------


@dataclass
class Exporter:
    """One exporter's figures over a measured window."""

    name: str
    scrapes: int
    errors: int
    latencies: list[float]
    cpu_seconds: float
    seconds: float
    rss_bytes: int
    peak_rss_bytes: int
    series: int

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)

    @property
    def cpu_share(self) -> float:
        return self.cpu_seconds / self.seconds if self.seconds > 0 else math.nan

    @property
    def cpu_per_scrape(self) -> float:
        return self.cpu_seconds / self.scrapes if self.scrapes else math.nan


NODE_EXPORTER = "node_exporter"
FLEETSCOPE_NET = "fleetscope, network collectors"
FLEETSCOPE_FULL = "fleetscope, every collector + pushes"


@dataclass
class SideBySideRun:
    exporters: dict[str, Exporter]
    pushed: int
    load: str

    def ratio(self, name: str, what: Callable[[Exporter], float]) -> float:
        base = self.exporters.get(NODE_EXPORTER)
        mine = self.exporters.get(name)
        if base is None or mine is None or not what(base):
            return math.nan
        return what(mine) / what(base)


@dataclass
class SideBySide:
    runs: list[SideBySideRun]
    interval: float
    seconds: float
    ranks: int
    steps_per_second: float
    efa_counters: int
    note: str = ""

    def pooled(self, name: str) -> Exporter | None:
        """One exporter's figures over every run together."""
        parts = [run.exporters[name] for run in self.runs if name in run.exporters]
        if not parts:
            return None
        return Exporter(
            name, sum(p.scrapes for p in parts), sum(p.errors for p in parts),
            [lat for p in parts for lat in p.latencies], sum(p.cpu_seconds for p in parts),
            sum(p.seconds for p in parts), max(p.rss_bytes for p in parts), max(p.peak_rss_bytes for p in parts),
            parts[-1].series,
        )

    def spread(self, name: str, what: Callable[[Exporter], float]) -> tuple[float, float, float]:
        """(median, lowest, highest) over the runs of ``what`` as a ratio to node_exporter."""
        ratios = [r for r in (run.ratio(name, what) for run in self.runs) if not math.isnan(r)]
        if not ratios:
            return math.nan, math.nan, math.nan
        return statistics.median(ratios), min(ratios), max(ratios)


def _load() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as handle:
            return " / ".join(handle.read().split()[:3])
    except OSError:
        return "unknown"


def _window(names: Sequence[str], services: Sequence[Server], scrapers: Sequence[PacedScraper],
            seconds: float) -> list[Exporter]:
    """Measure every service over one window: scrapes, latencies and CPU inside it only."""
    counts0 = [len(s.latencies) for s in scrapers]
    errors0 = [s.errors for s in scrapers]
    start = [sample_process(s.pid) for s in services]
    time.sleep(seconds)
    end = [sample_process(s.pid) for s in services]
    out = []
    for name, scraper, n0, e0, s0, s1 in zip(names, scrapers, counts0, errors0, start, end, strict=True):
        latencies = scraper.latencies[n0:]
        out.append(Exporter(name, len(latencies), scraper.errors - e0, latencies,
                            s1.cpu_seconds - s0.cpu_seconds, s1.wall - s0.wall, s1.rss_bytes, s1.hwm_bytes, 0))
    return out


def _side_by_side_run(settings: ScrapeSettings, run: int, log: Log) -> tuple[SideBySideRun, int]:
    tree = hard_tree(settings, f"side-{run}", index=50 + run)
    ticker = TreeTicker([tree], max_seconds=settings.seconds + 600)
    services: list[Server] = []
    names: list[str] = []
    if settings.node_exporter:
        services.append(node_exporter_service(settings.node_exporter, tree.paths.root, settings.workdir))
        names.append(NODE_EXPORTER)
    full = daemon_service(f"daemon-side-full-{run}", tree.paths.root, settings.workdir, ALL_COLLECTORS)
    services += [daemon_service(f"daemon-side-net-{run}", tree.paths.root, settings.workdir, NET_COLLECTORS), full]
    names += [FLEETSCOPE_NET, FLEETSCOPE_FULL]
    headers = scrape_headers(PROMETHEUS_ACCEPT, timeout=settings.interval)
    fleet: RankFleet | None = None
    with Services() as started:
        started.start(*services)  # each on port 0: the scrapers learn the ports it bound
        scrapers = [PacedScraper(s.port, settings.interval, headers=headers,
                                 delay=i * settings.interval / len(services)) for i, s in enumerate(services)]
        ticker.start()
        try:
            fleet = RankFleet(full.port, settings.ranks, settings.steps_per_second)
            fleet.start()
            for scraper in scrapers:
                scraper.start()
            time.sleep(max(3.0, 2 * settings.interval))  # first scrapes: formats asked for, renders cached
            log(f"  run {run + 1}/{settings.repeats}: {settings.seconds:.0f}s, "
                f"one scrape per {settings.interval:g}s each")
            load = _load()
            measured = _window(names, services, scrapers, settings.seconds)
            for exporter, service in zip(measured, services, strict=True):
                exporter.series = _series(metrics_text(service.port))
        finally:
            for scraper in scrapers:
                scraper.stop()
            pushed = fleet.stop()["sent"] if fleet is not None else 0
            ticker.stop()
    return SideBySideRun({e.name: e for e in measured}, pushed, load), tree.efa_counters()


def measure_side_by_side(settings: ScrapeSettings, log: Log = print) -> SideBySide:
    runs = []
    counters = 0
    for run in range(settings.repeats):
        result, counters = _side_by_side_run(settings, run, log)
        runs.append(result)
    note = "" if settings.node_exporter else "node_exporter binary not found: no side by side"
    return SideBySide(runs, settings.interval, settings.seconds, settings.ranks, settings.steps_per_second,
                      counters, note)


# -- a real Prometheus ---------------------------------------------------------------------------


@dataclass
class PrometheusTarget:
    job: str
    scrapes: float
    p50: float
    p99: float
    max: float
    samples: float
    up: float
    cpu_share: float
    rss_bytes: int


@dataclass
class RealPrometheus:
    version: str
    interval: float
    seconds: float
    targets: list[PrometheusTarget] = field(default_factory=list)
    note: str = ""

    def target(self, job: str) -> PrometheusTarget | None:
        return next((t for t in self.targets if t.job == job), None)


def _prometheus_value(prom: Any, expr: str) -> float:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else math.nan


def measure_prometheus(settings: ScrapeSettings, log: Log = print) -> RealPrometheus:
    """node_exporter and the full daemon (with pushes) scraped by a real Prometheus every 2 s."""
    import shutil

    from benchmarks.harness import binary_version
    from fleetscope_sim.prom import Prometheus

    binary = shutil.which("prometheus")
    if binary is None or not settings.node_exporter:
        return RealPrometheus("not installed", settings.interval, 0.0, note="prometheus or node_exporter not found")
    tree = hard_tree(settings, "prometheus-node", index=60)
    ticker = TreeTicker([tree], max_seconds=settings.prometheus_seconds + 600)
    exporter = node_exporter_service(settings.node_exporter, tree.paths.root, settings.workdir)
    daemon = daemon_service("daemon-prometheus", tree.paths.root, settings.workdir, ALL_COLLECTORS)
    interval = f"{round(settings.interval * 1000)}ms"  # Prometheus durations take no fractions
    prom = Prometheus(os.path.join(settings.workdir, "prometheus"))  # on a port it chose, read from its log
    fleet: RankFleet | None = None
    targets = []
    window = settings.prometheus_seconds
    with Services() as started:
        started.start(exporter, daemon)
        config = {  # the ports they bound
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": "1m"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{service.port}"]}]}
                for job, service in (("node_exporter", exporter), ("fleetscope", daemon))
            ],
        }
        ticker.start()
        try:
            fleet = RankFleet(daemon.port, settings.ranks, settings.steps_per_second)
            fleet.start()
            prom.start(config)
            time.sleep(max(3.0, 2 * settings.interval))
            log(f"  real Prometheus: {window:.0f}s, both targets every {interval}")
            start = {s.name: sample_process(s.pid) for s in (exporter, daemon)}
            time.sleep(window)
            end = {s.name: sample_process(s.pid) for s in (exporter, daemon)}
            span = f"[{max(1, int(window))}s]"
            for job, service in (("node_exporter", exporter), ("fleetscope", daemon)):
                sel = f'{{job="{job}"}}'
                s0, s1 = start[service.name], end[service.name]
                targets.append(PrometheusTarget(
                    job,
                    _prometheus_value(prom, f"count_over_time(scrape_duration_seconds{sel}{span})"),
                    _prometheus_value(prom, f"quantile_over_time(0.5, scrape_duration_seconds{sel}{span})"),
                    _prometheus_value(prom, f"quantile_over_time(0.99, scrape_duration_seconds{sel}{span})"),
                    _prometheus_value(prom, f"max_over_time(scrape_duration_seconds{sel}{span})"),
                    _prometheus_value(prom, f"avg_over_time(scrape_samples_scraped{sel}{span})"),
                    _prometheus_value(prom, f"avg_over_time(up{sel}{span})"),
                    (s1.cpu_seconds - s0.cpu_seconds) / (s1.wall - s0.wall), s1.rss_bytes,
                ))
        finally:
            prom.stop()
            if fleet is not None:
                fleet.stop()
            ticker.stop()
    return RealPrometheus(binary_version(binary), settings.interval, window, targets)


# -- idle and scraper count ----------------------------------------------------------------------


@dataclass
class IdleRow:
    label: str
    scrapers: int
    interval: float
    cpu_share: float
    scrapes: int
    rss_bytes: int


IDLE_VARIANTS: tuple[tuple[str, int, float, bool], ...] = (  # label, scrapers, interval, may pause
    ("no scraper", 0, 0.0, True),
    ("no scraper, pausing off", 0, 0.0, False),
    ("one scraper every 15 s", 1, 15.0, True),
    ("one scraper every 2 s", 1, 2.0, True),
    ("two scrapers every 15 s (an HA pair)", 2, 15.0, True),
    ("two scrapers every 2 s", 2, 2.0, True),
)


def measure_idle(settings: ScrapeSettings, log: Log = print) -> list[IdleRow]:
    """The full daemon (8 GPUs on the fake, no pushes) per scraper count, all variants at the same time."""
    tree = hard_tree(settings, "idle-node", index=70)
    ticker = TreeTicker([tree], max_seconds=settings.idle_seconds + settings.pause_after + 600)
    quick = settings.interval < 1.0
    # A quick run's scrapers all scrape every settings.interval: variants that differ only in their scrape
    # interval would measure the same thing there, so one daemon per scraper count runs.
    variants = [v for i, v in enumerate(IDLE_VARIANTS)
                if not quick or v[1] == 0 or all(w[1] != v[1] for w in IDLE_VARIANTS[:i])]
    daemons = []
    for i, (_, _, _, pausable) in enumerate(variants):
        daemon = daemon_service(f"idle-{i}", tree.paths.root, settings.workdir, ALL_COLLECTORS,
                                pause_after=f"{settings.pause_after:g}s" if pausable else "0")
        daemons.append(daemon)
    scrapers: list[list[PacedScraper]] = []
    headers = scrape_headers(PROMETHEUS_ACCEPT)
    with Services() as started:
        started.start(*daemons)
        ticker.start()
        try:
            for (_, count, interval, _), daemon in zip(variants, daemons, strict=True):
                every = settings.interval if quick and count else interval
                mine = [PacedScraper(daemon.port, every, headers=headers, delay=k * every / 2) for k in range(count)]
                for scraper in mine:
                    scraper.start()
                scrapers.append(mine)
            log(f"  idle variants: {settings.pause_after:g}s for unscraped collectors to pause, then "
                f"{settings.idle_seconds:.0f}s measured")
            time.sleep(settings.pause_after + max(2.0, settings.interval))
            start = [sample_process(d.pid) for d in daemons]
            counts0 = [sum(len(s.latencies) for s in mine) for mine in scrapers]
            time.sleep(settings.idle_seconds)
            end = [sample_process(d.pid) for d in daemons]
            counts1 = [sum(len(s.latencies) for s in mine) for mine in scrapers]
        finally:
            for mine in scrapers:
                for scraper in mine:
                    scraper.stop()
            ticker.stop()
    rows = []
    for (label, count, interval, _), s0, s1, c0, c1 in zip(variants, start, end, counts0, counts1, strict=True):
        rows.append(IdleRow(label, count, interval, (s1.cpu_seconds - s0.cpu_seconds) / (s1.wall - s0.wall), c1 - c0,
                            s1.rss_bytes))
    return rows


# -- what one scrape and one reading cost --------------------------------------------------------


@dataclass
class RequestCost:
    what: str
    cpu_seconds: float  # daemon CPU per request, back to back on one kept-alive connection
    body_bytes: int


@dataclass
class PartCost:
    what: str
    cpu_seconds: float  # thread CPU time, median
    how_often: str


@dataclass
class ScrapePath:
    requests: list[RequestCost]
    per_reading: list[PartCost]
    per_scrape: list[PartCost]
    body_bytes: dict[str, int]  # OpenMetrics text and its gzip form, per scrape of the full daemon


def _request_costs(settings: ScrapeSettings, log: Log) -> list[RequestCost]:
    tree = hard_tree(settings, "requests-node", index=80)
    daemon = daemon_service("fleetscope-requests", tree.paths.root, settings.workdir, ALL_COLLECTORS)
    rows = []
    cases = (
        ("`/healthz` (the HTTP stack alone)", "/healthz", {}),
        ("`/metrics`, Prometheus 2 headers (OpenMetrics, gzip)", "/metrics", scrape_headers(PROMETHEUS_ACCEPT)),
        ("`/metrics`, Prometheus 3 headers (OpenMetrics, UTF-8 names, gzip)", "/metrics",
         scrape_headers(PROMETHEUS_3_ACCEPT)),
        ("`/metrics`, text 0.0.4, no gzip", "/metrics", {"Accept": "text/plain;version=0.0.4"}),
    )
    with Services() as started:
        started.start(daemon)
        log(f"  per-request daemon CPU: {settings.requests} requests per row, back to back")
        for what, path, headers in cases:
            client = KeepAliveClient(daemon.port)
            try:
                _, body = client.request("GET", path, headers=headers)  # warm: formats asked for, rendered
                s0 = sample_process(daemon.pid)
                for _ in range(settings.requests):
                    client.request("GET", path, headers=headers)
                s1 = sample_process(daemon.pid)
            finally:
                client.close()
            rows.append(RequestCost(what, (s1.cpu_seconds - s0.cpu_seconds) / settings.requests, len(body)))
    return rows


def _cpu_median(work: Callable[[], object], calls: int) -> float:
    samples = []
    for _ in range(calls):
        c0 = time.thread_time()
        work()
        samples.append(time.thread_time() - c0)
    return statistics.median(samples)


def _in_process_costs(settings: ScrapeSettings, log: Log) -> tuple[list[PartCost], list[PartCost], dict[str, int]]:
    """Per-reading and per-scrape costs of the full daemon's parts, in this process (no HTTP)."""
    import gzip
    import json

    from benchmarks.harness import step_record
    from benchmarks.nodeproc import node_flags
    from fleetscope.push.models import parse_records, reports_from_records
    from fleetscope.serve.daemon import build_engine
    from fleetscope.serve.engine import CollectorRunner
    from fleetscope.serve.exposition import Chunk, Format, Renderer, negotiate, render
    from fleetscope_sim.gpufeed import GpuFeed
    from fleetscope_sim.nodeproc import build_node_collectors, node_config

    log("  per-reading and per-scrape costs, in-process")
    tree = hard_tree(settings, "costs-node", index=90)
    tree.tick(1.0)
    config = node_config(tree.paths, "127.0.0.1:0", 15.0, node_flags(list(ALL_COLLECTORS), "default"))
    GpuFeed(tree.paths).install()
    collectors = build_node_collectors(config, tree.paths)
    engine = build_engine(config, collectors)
    records = [step_record("costs", r, s, settings.ranks) for r in range(settings.ranks) for s in range(1, 33)]
    collectors["steps"].store.ingest(reports_from_records(parse_records(json.dumps(records).encode())))
    om = negotiate(PROMETHEUS_ACCEPT)
    library_om = Format(om.content_type, om.encode)  # without the plain-names twin: prometheus_client as negotiated
    text = negotiate("text/plain;version=0.0.4")
    per_reading: list[PartCost] = []
    try:
        for runner in engine.runners:
            if not isinstance(runner, CollectorRunner):
                continue
            runner.run_once()
            every = f"every {runner.interval:g} s"
            per_reading.append(PartCost(f"`{runner.name}` collection", _cpu_median(runner.collector.collect,
                                                                                   settings.calls), every))
            metrics = runner.snapshot()[1]
            if not metrics:
                continue
            renderer = Renderer()
            renderer.render(metrics, om)  # the last reading's template, as the daemon keeps it
            per_reading.append(PartCost(f"`{runner.name}` render, OpenMetrics (same series as the last reading)",
                                        _cpu_median(lambda m=metrics, r=renderer: r.render(m, om), settings.calls),
                                        every))
            if runner.name == "efa":
                per_reading.append(PartCost("`efa` render by prometheus_client (first reading, or series changed)",
                                            _cpu_median(lambda m=metrics: render(m, om), settings.calls),
                                            "when the series change"))
                per_reading.append(PartCost("`efa` render by prometheus_client with the negotiated escaping",
                                            _cpu_median(lambda m=metrics: render(m, library_om), settings.calls),
                                            "before #16: every 15 s"))
                per_reading.append(PartCost("`efa` render, text 0.0.4 by prometheus_client", _cpu_median(
                    lambda m=metrics: render(m, text), settings.calls), "when asked for"))
            rendered = render(metrics, om).text
            per_reading.append(PartCost(f"`{runner.name}` gzip (its chunk deflated once)", _cpu_median(
                lambda text=rendered: Chunk(text).deflated(), settings.calls), every))
        engine.exposition(om, compressed=True)  # formats asked for: every part cached
        body = engine.exposition(om, compressed=False)
        per_scrape = [
            PartCost("whole `/metrics` body, cached parts joined and gzip-framed", _cpu_median(
                lambda: engine.exposition(om, compressed=True), settings.calls), "every scrape"),
            PartCost("same, uncompressed", _cpu_median(lambda: engine.exposition(om, compressed=False),
                                                       settings.calls), "every scrape"),
            PartCost("before this change: render everything, then gzip level 9 (Starlette)", _cpu_median(
                lambda: gzip.compress(render(list(engine.collect()), library_om).text, 9), settings.calls),
                "every scrape"),
        ]
        sizes = {"OpenMetrics": len(body), "gzip": len(engine.exposition(om, compressed=True))}
    finally:
        engine.stop()
    return per_reading, per_scrape, sizes


def measure_scrape_path(settings: ScrapeSettings, log: Log = print) -> ScrapePath:
    per_reading, per_scrape, sizes = _in_process_costs(settings, log)
    return ScrapePath(_request_costs(settings, log), per_reading, per_scrape, sizes)
