"""Render the suite's results as ``docs/benchmarks.md``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.harness import percentile
from benchmarks.measure import (
    Environment,
    NetCompare,
    NodeResults,
    ProfileResult,
    Profiles,
    PushResults,
    ScrapeSide,
    Settings,
)

MIB = 1024 * 1024


@dataclass(frozen=True)
class Target:
    what: str
    goal: str
    measured: float
    limit: float
    lower_is_better: bool
    unit: Callable[[float], str]

    @property
    def met(self) -> bool:
        if math.isnan(self.measured):
            return False
        return self.measured < self.limit if self.lower_is_better else self.measured > self.limit

    @property
    def verdict(self) -> str:
        if math.isnan(self.measured):
            return "not measured"
        if self.met:
            return "met"
        factor = self.measured / self.limit if self.lower_is_better else self.limit / self.measured
        return f"**missed** ({factor:.2f}x the target)"


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.1f} ms"


def pct(share: float) -> str:
    return "n/a" if math.isnan(share) else f"{share * 100:.2f}%"


def mib(size: float) -> str:
    return f"{size / MIB:.1f} MiB"


def rate(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.0f}"


def us(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f} µs"


def ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b) or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def targets(node: NodeResults, push: PushResults) -> list[Target]:
    base = node.variants[0]
    return [
        Target("daemon CPU (p5, 15 s scrape interval, pushes flowing)", "< 1% of one core", base.cpu_share, 0.01,
               True, pct),
        Target("daemon peak RSS (VmHWM)", "< 80 MiB", base.peak_rss_bytes, 80 * MIB, True, mib),
        Target("`/metrics` p99, two concurrent scrapers", "< 25 ms", percentile(node.latencies, 99), 0.025, True, ms),
        Target("client cost per step in the training thread (`tracker.report`)", "< 5 µs", push.client.report_us,
               5.0, True, us),
        Target("ingest, 8 ranks, batched as the client does", "> 20,000 records/s",
               node.ingest.records_per_second, 20_000, False, lambda v: f"{rate(v)} records/s"),
        Target("series per node", "< 2,500", node.series_total, 2500, True, lambda v: f"{v:,.0f}"),
    ]


def kubernetes_resources(node: NodeResults) -> dict[str, str]:
    """Requests and limits derived from the measured figures (rules stated in the report)."""
    base = node.variants[0]
    worst_rss = max(v.peak_rss_bytes for v in node.variants)
    cpu_request_m = max(10, 5 * math.ceil(base.cpu_share * 1000 * 2 / 5))
    render = percentile(node.latencies, 50)
    render = 0.1 if math.isnan(render) else render
    cpu_limit_m = min(2000, max(250, 250 * math.ceil(render / 0.1 * 1000 / 250)))
    mem_request_mib = 16 * math.ceil(worst_rss * 1.25 / MIB / 16)
    burst_rss = max(node.peak_rss_after_burst, node.peak_rss_after_ingest)
    mem_limit_mib = 64 * math.ceil(max(worst_rss * 2, burst_rss * 1.5) / MIB / 64)
    return {"cpu_request": f"{cpu_request_m}m", "cpu_limit": f"{cpu_limit_m}m",
            "memory_request": f"{mem_request_mib}Mi", "memory_limit": f"{mem_limit_mib}Mi"}


def push_request_cpu(node: NodeResults) -> float:
    """CPU seconds per push request, from the rank scaling (8 -> 64 ranks, one request per rank per second)."""
    by_label = {v.shape.label: v for v in node.variants}
    base, big = node.variants[0], by_label.get("64 ranks")
    if big is None or big.shape.ranks == base.shape.ranks:
        return math.nan
    return (big.cpu_share - base.cpu_share) / (big.shape.ranks - base.shape.ranks)


def cpu_budget(
    settings: Settings, node: NodeResults, profiles: list[ProfileResult]
) -> list[tuple[str, str, str, float]]:
    """(part, cost, frequency, share of one core) for the p5 daemon at production settings."""
    from benchmarks.measure import IDLE_LABEL
    from fleetscope.collectors import REGISTRY

    rows: list[tuple[str, str, str, float]] = []
    collections = 0.0
    for prof in profiles:
        if not prof.title.startswith("collector "):
            continue
        name = prof.title.split()[1].rstrip(":")
        entry = REGISTRY.get(name)
        if entry is None or entry.live:
            continue
        share = prof.cpu_seconds_per_call / entry.default_interval
        collections += share
        rows.append((f"`{name}` collection", ms(prof.cpu_seconds_per_call), f"every {entry.default_interval:g} s",
                     share))
    idle = next((v for v in node.variants if v.shape.label == IDLE_LABEL), None)
    if idle is not None:
        rows.append(("runtime when idle (measured idle daemon minus its collections)", "", "always",
                     max(0.0, idle.cpu_share - collections)))
    render = next((p for p in profiles if p.title.startswith("/metrics body, OpenMetrics")), None)
    if render is not None:
        rows.append(("`/metrics` render (OpenMetrics + gzip)", ms(render.cpu_seconds_per_call),
                     f"every {settings.scrape_interval:g} s", render.cpu_seconds_per_call / settings.scrape_interval))
    per_request = push_request_cpu(node)
    ranks = node.variants[0].shape.ranks
    rows.append(("push request (one rank's batch, client's own connection)", us(per_request * 1e6),
                 f"{ranks} per second (1 per rank)", per_request * ranks))
    return rows


def _side_row(side: ScrapeSide) -> str:
    return (f"| {side.name} | {side.scrapes} | {ms(side.median_seconds)} | {ms(side.p99_seconds)} | "
            f"{side.cpu_seconds_per_scrape * 1000:.2f} ms | {pct(side.cpu_share)} | {mib(side.peak_rss_bytes)} | "
            f"{side.network_series} | {side.series} | {us(side.cpu_us_per_series)} |")


def add_misses(add: Callable[[str], None], settings: Settings, node: NodeResults, push: PushResults,
               profile_set: Profiles) -> None:
    """One paragraph per missed target: by how much, and where the time goes."""
    profiles = profile_set.items
    options = profile_set.render_options
    missed = [t for t in targets(node, push) if not t.met]
    if not missed:
        return
    add("Where targets are missed:")
    add("")
    render_om = next((p for p in profiles if p.title.startswith("/metrics body, OpenMetrics")), None)
    render_text = next((p for p in profiles if p.title.startswith("/metrics body, text")), None)
    for target in missed:
        if target.what.startswith("`/metrics` p99") and render_om and render_text:
            efa = next((c for c in node.cycles if c.collector == "efa"), None)
            add(f"* **`/metrics` p99**: {target.unit(target.measured)} against {target.goal}. Rendering is "
                f"pure-Python work in prometheus_client: {ms(render_om.cpu_seconds_per_call)} of CPU for OpenMetrics "
                f"+ gzip (what Prometheus asks for first) and {ms(render_text.cpu_seconds_per_call)} for the text "
                "format, "
                f"per render on one thread; two concurrent scrapes share one GIL, so each takes about twice that, "
                f"and a background collection running at the same time adds its own Python time"
                + (f" (an EFA cycle takes up to {ms(efa.max_seconds)})" if efa else "") + ". In the OpenMetrics "
                "encoder, `_escape` and the per-character label-name check dominate (profile below). Asking for "
                f"the text format gives p99 {ms(percentile(node.text_latencies, 99))}. Fixes, in the HTTP layer: "
                "answer with the text format even when OpenMetrics is offered, and keep each background "
                "collector's rendered text with its reading (it changes once per interval, not per scrape), "
                "rendering only the live `steps` families per scrape"
                + (f": {ms(options[-1][1])} of CPU per scrape instead of {ms(options[0][1])} "
                   "(table under *Where the time goes*)." if len(options) > 1 else "."))
        elif target.what.startswith("series"):
            over = node.series_total - 2500
            top = ", ".join(f"`{name}` ({count})" for name, count in node.largest_metrics[:5])
            add(f"* **series**: {node.series_total:,}, {over:,} over the goal. The largest families: {top}. "
                "Per-link NVLink error counters (links x 3 error kinds per GPU) and per-verb EFA error counters "
                "are most of it; the EFA lifespan gauges are configuration, not telemetry.")
        elif target.what.startswith("daemon CPU"):
            parts = sorted(cpu_budget(settings, node, profiles), key=lambda row: -row[3])[:3]
            biggest = "; ".join(f"{part} {pct(share)}" for part, _, _, share in parts)
            post = push.row("fleetscope", "POST per record")
            keep_alive = (f" On a kept-alive connection a push costs the daemon {us(post.cpu_us_per_record)} "
                          f"(section 5) instead of {us(push_request_cpu(node) * 1e6)}." if post else "")
            add(f"* **daemon CPU**: {pct(target.measured)} of one core, {target.verdict.split('(')[-1].rstrip(')')}. "
                f"Largest parts (CPU budget in section 2): {biggest}. The client's sender opens a new connection "
                "for every push (`urllib`), one per rank per second; a persistent connection, the cached render "
                f"below and a longer flush interval each cut one of these.{keep_alive}")
        elif target.what.startswith("client"):
            add(f"* **client**: {us(push.client.report_us)} per `report` with the sender idle, "
                f"{us(push.client.report_busy_us)} with the sender busy in the same process (GIL); the call "
                "builds a dict and appends it to a locked deque.")
        elif target.what.startswith("ingest"):
            add(f"* **ingest**: {target.unit(target.measured)}; see section 5 for the per-request cost.")
        elif target.what.startswith("daemon peak RSS"):
            add(f"* **peak RSS**: {mib(target.measured)}; the variants in section 2 show what it grows with.")
    add("")


def render(settings: Settings, env: Environment, date: str, node: NodeResults, net: NetCompare,
           push: PushResults, profile_set: Profiles, quick: bool, wall_seconds: float) -> str:
    profiles = profile_set.items
    base = node.variants[0]
    lines: list[str] = []
    add = lines.append
    add("# Benchmarks")
    add("")
    add("Generated by `python3 benchmarks/run.py`" + (" **--quick (smoke-test mode: figures are not meaningful)**"
                                                      if quick else "") + "; do not edit by hand.")
    add(f"Run on {date}, {wall_seconds:.0f} s wall time. Absolute times on a shared machine drift between runs; "
        "the side-by-side ratios, measured in the same run on the same tree, are the figures to compare.")
    add("")
    add("Options: `--duration SECONDS` (sustained CPU/RSS window, default 60), `--quick` (smoke test), "
        "`--out FILE`, `--workdir DIR` (keep trees and daemon logs).")
    add("")
    add("## Machine and versions")
    add("")
    add(f"* CPU: {env.cpu_model}, {env.cores} cores ({env.cores_usable} usable by this run)")
    add(f"* Load average (1/5/15 min) before the run: {env.load_before}; after: {env.load_after} "
        "(anything well above the suite's own load means other work shared the cores, and latencies suffer)")
    add("* " + ", ".join(f"{name} {version}" for name, version in env.versions.items()))
    add("")

    add("## Headline")
    add("")
    pg = push.row("Pushgateway", "PUT per record")
    fs_post = push.row("fleetscope", "POST per record")
    fs_put = push.row("fleetscope", "PUT per record")
    fs_batch = push.row("fleetscope", f"POST batched ({settings.ingest_batch})")
    if net.node_exporter is not None:
        ne, fs = net.node_exporter, net.fleetscope
        add(f"* **Network collectors vs node_exporter** (same tree, one scrape per {net.interval:g} s): fleetscope "
            f"uses {ratio(fs.cpu_seconds_per_scrape, ne.cpu_seconds_per_scrape)} node_exporter's CPU per scrape "
            f"and its scrape p99 is {ratio(fs.p99_seconds, ne.p99_seconds)} node_exporter's, while exporting "
            f"{ratio(fs.network_series, ne.network_series)} as many network series "
            f"({fs.network_series} vs {ne.network_series}: node_exporter 1.5 reads no EFA counter); per network "
            f"series, fleetscope's CPU is {ratio(fs.cpu_us_per_series, ne.cpu_us_per_series)} node_exporter's.")
    else:
        add(f"* Network side by side: {net.note}")
    if pg is not None and fs_post is not None:
        add(f"* **Push endpoint vs Pushgateway** (8 ranks, one request per step record): fleetscope POST handles "
            f"{ratio(fs_post.outcome.records_per_second, pg.outcome.records_per_second)} the Pushgateway's records/s "
            f"({rate(fs_post.outcome.records_per_second)} vs {rate(pg.outcome.records_per_second)})"
            + (f"; through its Pushgateway-compatible PUT route "
               f"{ratio(fs_put.outcome.records_per_second, pg.outcome.records_per_second)}" if fs_put else "")
            + (f"; batched as the client sends them, "
               f"{ratio(fs_batch.outcome.records_per_second, pg.outcome.records_per_second)}" if fs_batch else "")
            + ".")
    else:
        add(f"* Push side by side: {push.note}")
    add("")
    add("| target | goal | measured | verdict |")
    add("|---|---|---|---|")
    for target in targets(node, push):
        add(f"| {target.what} | {target.goal} | {target.unit(target.measured)} | {target.verdict} |")
    add("")
    if node.peak_rss_after_burst:
        add(f"Peak RSS above is the steady state with pushes flowing; 8 ranks pushing bodies at "
            f"`push.max-body-bytes` at once take it to {mib(node.peak_rss_after_burst)} (section 3), which the "
            "memory limit below allows for.")
        add("")
    add_misses(add, settings, node, push, profile_set)

    add("## 1. `/metrics` latency and collection cycles")
    add("")
    add(f"Simulated p5.48xlarge node ({base.shape.gpus} GPUs on the NVML fake, {base.shape.efa} EFA devices, "
        f"{base.shape.ena} ENA interfaces, {base.shape.ranks} ranks pushing through `fleetscope.client`), "
        f"two Prometheus-like clients (OpenMetrics Accept header, gzip, keep-alive) scraping back to back, "
        f"{settings.latency_scrapes} scrapes each. Latency is request sent to body received.")
    add("")
    add("| format asked for | scrapes | median | p90 | p99 | max |")
    add("|---|---|---|---|---|---|")
    for label, lat in (("OpenMetrics first (Prometheus's Accept header)", node.latencies),
                       ("text 0.0.4 only", node.text_latencies)):
        add(f"| {label} | {len(lat)} | {ms(percentile(lat, 50))} | {ms(percentile(lat, 90))} | "
            f"{ms(percentile(lat, 99))} | {ms(max(lat) if lat else math.nan)} |")
    add("")
    add(f"Errors: {node.latency_errors}. Body: {node.exposition_bytes / 1024:.0f} KiB in the text format, "
        "uncompressed.")
    add("")
    add(f"Time per collection cycle, from `fleetscope_collector_duration_seconds` on a second p5 daemon collecting "
        f"every {settings.cycle_interval:g} s during the sustained run (one sample per cycle, keyed by "
        "`fleetscope_collector_last_success_timestamp_seconds`; `steps` is collected at scrape time):")
    add("")
    add("| collector | cycles | median | max |")
    add("|---|---|---|---|")
    for cycle in node.cycles:
        add(f"| {cycle.collector} | {cycle.cycles} | {ms(cycle.median_seconds)} | {ms(cycle.max_seconds)} |")
    add("")

    add("## 2. Daemon CPU and memory")
    add("")
    add(f"Each variant is its own daemon process at default intervals (network collectors 15 s, GPU 10 s), "
        f"scraped every {settings.scrape_interval:g} s, its ranks reporting {settings.steps_per_second:g} steps/s "
        f"each through `fleetscope.client.StepTracker` (batched, flushed every second). All variants run at the same "
        f"time for {settings.sustained_seconds:g} s (`--duration`). CPU is the utime+stime delta from "
        "`/proc/<pid>/stat` over the window, as a share of one core; peak RSS is `VmHWM`.")
    add("")
    add("| variant | GPUs | EFA | ENA | ranks | CPU (share of one core) | peak RSS | RSS at end | records pushed |")
    add("|---|---|---|---|---|---|---|---|---|")
    for v in node.variants:
        add(f"| {v.shape.label} | {v.shape.gpus} | {v.shape.efa} | {v.shape.ena} | {v.shape.ranks} | "
            f"{pct(v.cpu_share)} | {mib(v.peak_rss_bytes)} | {mib(v.rss_bytes)} | "
            f"{v.pushes.get('sent', 0):,} |")
    add("")
    by_label = {v.shape.label: v for v in node.variants}
    growth = []
    for label, what in (("1 GPU", "GPUs 1 → 8"), ("4 EFA devices", "EFA devices 4 → 32"),
                        ("1 rank", "ranks 1 → 8")):
        small = by_label.get(label)
        if small is not None:
            growth.append(f"{what}: CPU {ratio(base.cpu_share, small.cpu_share)}, "
                          f"peak RSS {ratio(base.peak_rss_bytes, small.peak_rss_bytes)}")
    big = by_label.get("64 ranks")
    if big is not None:
        growth.append(f"ranks 8 → 64: CPU {ratio(big.cpu_share, base.cpu_share)}, "
                      f"peak RSS {ratio(big.peak_rss_bytes, base.peak_rss_bytes)}")
    add("Growth: " + "; ".join(growth) + ".")
    add("")
    add("Where the p5 daemon's CPU goes, estimated (each part's CPU cost times how often it runs) against the "
        "measured total. Collection and render costs are thread CPU times from *Where the time goes*; the idle "
        "runtime comes from the idle variant; the cost of one push request is the slope of the rank scaling "
        "(64 ranks minus 8 ranks, one request per rank per second, each on a new connection as the client's "
        "`urllib` sender makes them):")
    add("")
    add("| part | cost | how often | share of one core |")
    add("|---|---|---|---|")
    budget = cpu_budget(settings, node, profiles)
    for part, cost, often, share in budget:
        add(f"| {part} | {cost} | {often} | {pct(share)} |")
    add(f"| **sum of parts** | | | {pct(sum(row[3] for row in budget))} |")
    add(f"| **measured** | | | {pct(base.cpu_share)} |")
    add("")

    add("## 3. Push path")
    add("")
    c = push.client
    add(f"Client cost in the training thread (`fleetscope.client.StepTracker` pushing to a live daemon, "
        f"{c.calls:,} calls in all). *Training loop*: bursts of 100 calls with pauses between them, so the "
        "sender thread is idle while the loop runs, as it is when steps are milliseconds to seconds apart "
        "(median over bursts). *Tight loop*: calls back to back, the sender thread encoding and posting full "
        "batches alongside and competing for the GIL (median of 3 runs).")
    add("")
    add("| call | training loop | tight loop |")
    add("|---|---|---|")
    add(f"| `tracker.report(step_seconds, data_seconds=..., compute_seconds=..., comm_seconds=..., tokens=..., "
        f"samples=..., loss=...)` | {us(c.report_us)} | {us(c.report_busy_us)} |")
    add(f"| `with tracker.step():` + three `with tracker.phase(...)` + loss | {us(c.step_us)} | "
        f"{us(c.step_busy_us)} |")
    add("")
    add(f"Records delivered by that tracker: {c.sent:,}; dropped by its bounded buffer when the tight loop "
        f"outran delivery (by design: the loop never waits): {c.dropped:,}.")
    add("")
    ing = node.ingest
    add(f"Ingest on the full p5 daemon (all collectors running): 8 concurrent ranks, each posting batches of "
        f"{settings.ingest_batch} records (the client's batch size) back to back for {settings.push_seconds:g} s: "
        f"**{rate(ing.records_per_second)} records/s** ({ing.requests:,} requests, {ing.errors} errors); "
        f"peak RSS after it: {mib(node.peak_rss_after_ingest)}.")
    add("")
    if node.burst is not None:
        b = node.burst
        add(f"Memory under the largest bodies: 8 ranks at once, each posting {b.requests // 8 if b.requests else 0} "
            f"bodies of {node.burst_records_per_body:,} records (just under `push.max-body-bytes`, 1 MiB): "
            f"{b.records:,} records accepted, {b.errors} errors, peak RSS after it "
            f"**{mib(node.peak_rss_after_burst)}**.")
        add("")

    add("## 4. Series per node")
    add("")
    add(f"One scrape of the p5 daemon after the sustained run: **{node.series_total:,} series**.")
    add("")
    add("| collector | series |")
    add("|---|---|")
    for collector, count in sorted(node.series.items(), key=lambda item: -item[1]):
        add(f"| {collector} | {count:,} |")
    add("")
    add("Largest metrics: " + ", ".join(f"`{name}` {count}" for name, count in node.largest_metrics) + ".")
    add("")

    from benchmarks import nccl  # the Inspector's series and reading cost: deterministic, a few seconds

    lines.extend(nccl.render(nccl.measure(5_000 if quick else 50_000)))

    add("## 5. Side by side")
    add("")
    add("### Network collectors vs node_exporter")
    add("")
    add(f"Both read the same simulated p5 tree (32 EFA devices, 4 ENA interfaces, moving counters), each scraped "
        f"once per {net.interval:g} s by its own client for {settings.compare_seconds:g} s, at the same time. "
        f"fleetscope runs only `efa`, `netdev`, `netstat` and `ena` with its collection interval equal to the "
        "scrape interval, so every scrape pays for one collection. node_exporter runs "
        "`--collector.disable-defaults --collector.netdev --collector.netstat --collector.infiniband` with "
        "`--path.sysfs`/`--path.procfs` on the tree. CPU per scrape = process CPU delta / scrapes in the window.")
    add("")
    add("| exporter | scrapes | median | p99 | CPU per scrape | CPU (share of one core) | peak RSS | "
        "network series | all series | CPU per network series |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    if net.node_exporter is not None:
        add(_side_row(net.node_exporter))
    add(_side_row(net.fleetscope))
    add("")
    add("Not like for like, in node_exporter's favour: node_exporter 1.5's infiniband collector reads only port "
        "state and rate from an EFA device (no `hw_counters`), and only after the tree is given the `board_id`, "
        "`hca_type` and empty `ports/1/counters/` it insists on (current EFA kernels have none of them, so on a "
        "real p5 it reports no EFA device at all). fleetscope's ENA collector reads the simulator's state file "
        "where a real node answers an ioctl. fleetscope serves scrapes from its last collection; node_exporter "
        "collects during the scrape, so its latency includes the reads.")
    add("")
    add("### Push endpoint vs Pushgateway")
    add("")
    add(f"8 ranks as 8 threads with keep-alive connections, pushing for {settings.push_seconds:g} s per row. "
        "Pushgateway: a PUT of the rank's group (`/metrics/job/<job>/rank/<rank>`, text format, 9 gauges) per "
        "record. fleetscope: the same PUT on its Pushgateway-compatible route, one JSON record per POST, and "
        f"batches of {settings.ingest_batch}. Server CPU is the server process's CPU delta over the row.")
    add("")
    add("| server | workload | records/s | requests/s | errors | server CPU per record |")
    add("|---|---|---|---|---|---|")
    for row in push.rows:
        add(f"| {row.server} | {row.workload} | {rate(row.outcome.records_per_second)} | "
            f"{rate(row.outcome.requests_per_second)} | {row.outcome.errors} | {us(row.cpu_us_per_record)} |")
    add("")
    add("The load generator is Python in this process and shares the machine's cores with the servers, so the "
        "fastest rows are bounded by the client as well as the server.")
    add("")

    add("## Where the time goes")
    add("")
    add("CPU per scrape to produce the `/metrics` body of the p5 node (thread CPU time, median), today and with "
        "the changes the HTTP layer could make:")
    add("")
    add("| how the body is made | CPU per scrape | vs today |")
    add("|---|---|---|")
    today = profile_set.render_options[0][1] if profile_set.render_options else math.nan
    for label, seconds in profile_set.render_options:
        add(f"| {label} | {ms(seconds)} | {ratio(seconds, today)} |")
    add("")
    add("cProfile, in the benchmark process, of the p5 daemon's parts on the same kind of tree: per call, top "
        "functions by own time. The profiler inflates Python-heavy code 2-4x, so read its columns as proportions; "
        "the wall and CPU figures above each table are measured without it.")
    add("")
    for prof in profiles:
        add(f"**{prof.title}**: {ms(prof.seconds_per_call)} wall, {ms(prof.cpu_seconds_per_call)} CPU per call "
            f"(medians of {prof.calls} calls without the profiler).")
        add("")
        add("| function | calls | own time | cumulative |")
        add("|---|---|---|---|")
        for func, ncalls, tottime, cumtime in prof.top:
            add(f"| `{func}` | {ncalls} | {ms(tottime)} | {ms(cumtime)} |")
        add("")

    k8s = kubernetes_resources(node)
    worst = max(node.variants, key=lambda v: v.peak_rss_bytes)
    add("## Kubernetes resources")
    add("")
    add("Recommended for the DaemonSet container, derived from the figures above:")
    add("")
    add("```yaml")
    add("resources:")
    add(f"  requests: {{cpu: {k8s['cpu_request']}, memory: {k8s['memory_request']}}}")
    add(f"  limits: {{cpu: {k8s['cpu_limit']}, memory: {k8s['memory_limit']}}}")
    add("```")
    add("")
    add(f"* CPU request: twice the sustained p5 average ({pct(base.cpu_share)} of a core), at least 10m.")
    add(f"* CPU limit: room for a scrape (median {ms(percentile(node.latencies, 50))} with two scrapers at once, "
        "nearly all of it Python on one core) to finish inside one 100 ms CFS period without throttling, rounded "
        "up to 250m steps, between 250m and 2 cores. A tighter limit stretches scrape latency, not throughput. "
        "For comparison, dcgm-exporter's Helm chart requests 100m / 128Mi with limits 200m / 512Mi "
        "(NVIDIA/dcgm-exporter, deployment/values.yaml).")
    add(f"* Memory request: 1.25x the largest peak RSS measured ({mib(worst.peak_rss_bytes)}, variant "
        f"\"{worst.shape.label}\"), rounded up to 16 MiB.")
    add(f"* Memory limit: the larger of 2x that peak and 1.5x the peak after the burst of largest bodies "
        f"({mib(max(node.peak_rss_after_burst, node.peak_rss_after_ingest))}, section 3), rounded up to 64 MiB, so "
        "that pushes at the limits (`push.max-body-bytes`, `push.max-ranks`) do not end in an OOM kill.")
    add("")
    return "\n".join(lines) + "\n"
