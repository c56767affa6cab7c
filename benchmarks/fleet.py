"""Fleet scale (#15): every shipped rule group and the fleet and job dashboards on a real Prometheus that
scrapes a synthetic fleet of p5 nodes.

    python3 benchmarks/fleet.py --nodes 512,1024,2048          # regenerates docs/benchmarks-fleet.md
    python3 benchmarks/fleet.py --nodes 64 --warmup 5.5 --cycles 2 --out /tmp/fleet/  # #27's check
    # Where there is no simulator or package registry (the GPU lease machine): save one node's scrape here,
    # carry it with a prometheus binary, and run with prometheus_client and PyYAML only (docs/benchmarks-fleet.md).
    python3 benchmarks/fleet.py --write-template fleet-node.prom
    python3 benchmarks/fleet.py --nodes 2048 --warmup 2.5 --cycles 1.5 --max-interval 1m \
        --template fleet-node.prom --prometheus /tmp/prometheus --out "$OUT/fleet/"

Each node is one real p5 scrape at the default detail level (the simulator's p5.48xlarge read by the real
collectors through the real daemon, 8 ranks pushing steps), copied per node with its ranks' own
``training_job``/``rank`` and values that move: counters grow at the rate the template implies (jittered
per node), gauges wander by 1%. 64 jobs share the fleet; a few faults are planted: two jobs with one slow
rank (its compute share up, its peers' communication wait up, every rank's steps slower, as synchronous
training does), a hot and clock-throttled GPU, a node whose EFA drops packets.

One process serves every node as its own target (``/node/<n>/metrics``, values computed at scrape time);
Prometheus scrapes them every ``--scrape-interval`` with ``job``, ``instance`` and ``cluster`` target labels
as the shipped scrape configs give, so its head holds the real series, and evaluates every group of
``alerts/fleetscope.rules.yml`` at its shipped interval, 1 minute where it ships none (``--max-interval 1m``
evaluates the slower ones every minute too, for a short run that must time every group). After ``--warmup``
minutes (the 5m windows full) it watches ``--cycles`` evaluations and reports per group the evaluation
time (``prometheus_rule_group_last_duration_seconds``, the largest seen), the samples it wrote, missed
iterations, Prometheus's peak memory, and the growth between sizes; then every query of the fleet and job
dashboards runs as Grafana sends it (1h range at 60 s steps, or instant) with one job selected.

Not measured: the 15m/1h/7d windows hold only the minutes of the run (their cost grows with history:
about linearly in samples per series, the same for every size), and remote write.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import enum
import functools
import http.server
import json
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import REPO_ROOT, find_binary, http_get
from fleetscope.metrics.spec import DetailLevel
from fleetscope.rules.settings import seconds
from fleetscope_sim.harness import Prometheus

JOBS = 64
RANKS_PER_NODE = 8
CLUSTER = "fleet-bench"
FLEET_DASHBOARDS = ("fleetscope-fleet", "fleetscope-job")
SLOW_JOBS = (3, 41)  # jobs with one slow rank


# -- one node -------------------------------------------------------------------------------------------


def scrape_p5_node(root: Path, level: DetailLevel) -> str:
    """One scrape of a simulated p5 node's daemon at ``level``, after two collections (GPM needs two samples)."""
    import time as clock

    from fastapi.testclient import TestClient

    from fleetscope.serve.daemon import build_daemon
    from fleetscope.serve.engine import CollectorRunner
    from fleetscope_sim.gpufeed import GpuFeed
    from fleetscope_sim.node import Load, NodeModel
    from fleetscope_sim.nodeproc import build_node_collectors, node_config
    from fleetscope_sim.nvml_fake import uninstall
    from fleetscope_sim.profiles import P5
    from fleetscope_sim.tree import NodePaths, TreeWriter

    profile = dataclasses.replace(P5, ena_interfaces=("ens32", "ens64", "ens96", "ens128"))
    paths = NodePaths(str(root))
    model = NodeModel("p5-budget", 0, profile, seed=7)
    writer = TreeWriter(model, paths)
    writer.setup()
    # The ranks are this process, as the node's /proc shows it: the daemon watches them (process_up).
    from fleetscope.wire import process_start_time

    start_time = process_start_time()
    model.tick(1.0, 1.0, Load(gpu_busy=dict.fromkeys(range(8), 0.9), network=0.8), [])
    writer.update()
    os.symlink(f"/proc/{os.getpid()}", os.path.join(paths.procfs, str(os.getpid())))
    config = node_config(paths, "127.0.0.1:0", 15.0, {"collector.efa.detail": level, "collector.gpu.detail": level})
    GpuFeed(paths).install()
    try:
        daemon = build_daemon(config, collectors=build_node_collectors(config, paths))
        for _ in range(2):
            for runner in daemon.engine.runners:
                if isinstance(runner, CollectorRunner):  # live ones are read at scrape time
                    status = runner.run_once().status
                    assert status == ("no_hardware" if runner.name == "nccl" else "ok"), runner.name
        with TestClient(daemon.app) as client:
            for rank in range(RANKS_PER_NODE):
                now = clock.time()
                report = {"job": "llama", "rank": rank, "local_rank": rank, "world_size": 64, "gpu": rank,
                          "pid": os.getpid(), "start_time": start_time,
                          "steps": [{"step": 10, "step_seconds": 1.0, "timestamp": now - 0.1, "data_seconds": 0.02,
                                     "fetch_seconds": 0.05, "compute_seconds": 0.78, "comm_seconds": 0.2,
                                     "tokens": 32768, "samples": 8, "loss": 2.5}],
                          "position": {"step": 11, "phase": "compute", "since": now - 0.05}}
                assert client.post("/api/v1/report", json=report).status_code == 200
            response = client.get("/metrics")
        daemon.engine.stop()
    finally:
        uninstall()
    assert response.status_code == 200
    return response.text


class Kind(enum.Enum):
    """How a series moves from scrape to scrape, as the real one does."""

    COUNTER = "counter"  # grows at its per-second rate
    CLOCK = "clock"  # a Unix time that keeps up with the clock (last push, last step, phase start)
    LEVEL = "level"  # a state, a count or a flag: 0/1 comparisons (`== 1`) must hold, so it never wobbles
    GAUGE = "gauge"  # a measurement (temperature, a median): wanders by 1%


# Step numbers grow with the steps, as the counters do: one a second (the template's steps take 1 s).
STEP_GAUGES = ("fleetscope_training_last_step", "fleetscope_training_current_step")


@dataclass(frozen=True)
class TemplateSeries:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float  # counters: per second (the template is one second of load); clocks: age in seconds
    kind: Kind

    @property
    def counter(self) -> bool:
        return self.kind is Kind.COUNTER


def template(text: str, taken: float | None = None) -> list[TemplateSeries]:
    """One node's series from its scrape, taken at ``taken`` (Unix time; default now)."""
    taken = time.time() if taken is None else taken
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            value = float(sample.value)
            if sample.name in STEP_GAUGES:
                kind, value = Kind.COUNTER, 1.0
            elif family.type in ("counter", "histogram", "summary"):
                kind = Kind.COUNTER
            elif sample.name.endswith("_timestamp_seconds"):
                kind, value = Kind.CLOCK, max(0.0, taken - value)
            elif value.is_integer():
                kind = Kind.LEVEL
            else:
                kind = Kind.GAUGE
            out.append(TemplateSeries(sample.name, tuple(sorted(sample.labels.items())), value, kind))
    return out


# -- the fleet ------------------------------------------------------------------------------------------


@dataclass
class Series:
    prefix: str  # name{labels}
    base: float  # counters: the value at the start; clocks: the age; levels and gauges: the value
    rate: float  # per second, counters
    kind: Kind

    @property
    def counter(self) -> bool:
        return self.kind is Kind.COUNTER


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items())) + "}"


def _rank_labels(labels: dict[str, str], node: int, nodes_per_job: int) -> dict[str, str]:
    if "training_job" not in labels:
        return labels
    job, node_in_job = divmod(node, nodes_per_job)
    local = int(labels.get("local_rank", labels.get("rank", "0")))
    rank = node_in_job * RANKS_PER_NODE + local
    out = dict(labels, training_job=f"job-{job:02d}", rank=str(rank))
    if "dp_rank" in out:
        out["dp_rank"] = str(rank)
    if "world_size" in out:
        out["world_size"] = str(nodes_per_job * RANKS_PER_NODE)
    return out


def _fault(name: str, labels: dict[str, str], node: int, nodes_per_job: int, base: float, rate: float,
           counter: bool) -> tuple[float, float]:
    """The planted faults: slow ranks, a hot throttled GPU, a node dropping EFA packets."""
    job, node_in_job = divmod(node, nodes_per_job)
    if name.startswith("fleetscope_training_") and job in SLOW_JOBS:
        # Steps take 1.15 s instead of 1 s: the slow rank computes 0.95 s instead of 0.78 s and waits little in
        # the all-reduce; its peers wait for it there. Counters grow per second, medians are per step.
        slow_rank = node_in_job == 0 and labels.get("local_rank") == "2"
        compute = 0.95 / 0.78 if slow_rank else 1.0
        comm = 0.03 / 0.2 if slow_rank else 0.35 / 0.2
        if counter:
            if name.endswith(("_steps_total", "_tokens_total", "_samples_total")) or name in STEP_GAUGES:
                return base, rate / 1.15  # everyone waits for the slow rank
            if "compute_seconds" in name:
                return base, rate * compute / 1.15
            if "comm_seconds" in name:
                return base, rate * comm / 1.15
        elif name == "fleetscope_training_step_seconds_median":
            return base * 1.15, rate
        elif name == "fleetscope_training_compute_seconds_median":
            return base * compute, rate
        elif name == "fleetscope_training_comm_seconds_median":
            return base * comm, rate
    if node == 17 and labels.get("gpu") == "3":
        if name == "fleetscope_gpu_temperature_celsius":
            return base + 25, rate
        if name == "fleetscope_gpu_clock_hertz" and labels.get("clock") == "sm":
            return base * 0.7, rate
    if node == 29 and name == "fleetscope_efa_rx_drops_total":
        return base, max(rate, 1.0) * 500
    return base, rate


def fleet_series(nodes: int, node_template: list[TemplateSeries], seed: int = 1) -> list[list[Series]]:
    """Every node's series (without the target labels Prometheus adds), node by node."""
    rng = random.Random(seed)
    nodes_per_job = max(1, nodes // JOBS)
    out: list[list[Series]] = []
    for node in range(nodes):
        scale = rng.uniform(0.95, 1.05)
        own: list[Series] = []
        for item in node_template:
            labels = _rank_labels(dict(item.labels), node, nodes_per_job)
            # the template is one second of load after start: its counters' values are their per-second rates
            rate = item.value * scale if item.counter else 0.0
            base, rate = _fault(item.name, labels, node, nodes_per_job, item.value, rate, item.counter)
            own.append(Series(item.name + (_labels(labels) if labels else ""), base, rate, item.kind))
        out.append(own)
    return out


def render_node(series: list[Series], elapsed: float, wobble: float, now: float | None = None) -> bytes:
    """One scrape of a node ``elapsed`` seconds into the run, at ``now`` (text format, no metadata)."""
    now = time.time() if now is None else now

    def value(s: Series) -> float:
        if s.kind is Kind.COUNTER:
            return s.base + s.rate * elapsed
        if s.kind is Kind.CLOCK:
            return now - s.base
        return s.base * wobble if s.kind is Kind.GAUGE else s.base

    return "".join(f"{s.prefix} {value(s):.15g}\n" for s in series).encode()


class FleetServer:
    """Every node of the fleet as its own target, ``/node/<n>/metrics``, values computed at scrape time."""

    def __init__(self, fleet: list[list[Series]]) -> None:
        self.fleet = fleet
        self.started = time.time()
        self.scrapes = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = self.path.split("/")
                if len(parts) != 4 or parts[1] != "node" or not parts[2].isdigit() or int(parts[2]) >= len(fleet):
                    self.send_error(404)
                    return
                node = int(parts[2])
                body = render_node(fleet[node], time.time() - server.started, 1.0 + 0.01 * math.sin(time.time() + node))
                server.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                # Prometheus may stop, or give up on the scrape, mid-answer.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # port 0: the one it bound, below
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FleetServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def scrape_config(nodes: int, port: int, interval: int) -> dict[str, Any]:
    """One target per node, labelled as the shipped scrape configs label a daemon (job, instance, cluster)."""
    return {
        "job_name": "fleetscope", "scrape_interval": f"{interval}s", "scrape_timeout": f"{min(interval, 20)}s",
        "static_configs": [
            {"targets": [f"127.0.0.1:{port}"],
             "labels": {"__metrics_path__": f"/node/{n}/metrics", "instance": f"p5-{n:05d}:9402", "cluster": CLUSTER}}
            for n in range(nodes)
        ],
    }


# -- Prometheus -----------------------------------------------------------------------------------------


# The first line of a --write-template file.
TAKEN_AT = "# fleetscope fleet template, taken at "

# The global evaluation interval of the benchmark's Prometheus (its default): the groups that ship without one.
EVALUATION_INTERVAL = "1m"


def rules_for_bench(source: Path, target: Path, max_interval: str = "") -> dict[str, float]:
    """The shipped rules, each group at its shipped interval (or the global one); returns group -> its shipped
    interval in seconds.

    Not one interval for all: the range reads of recorded series (a smoothed ratio, a 10m median) read as
    many samples as the recording group wrote, so a group evaluated at another pace reads another amount.
    ``max_interval`` evaluates the slower groups that often, for a short run that must time every group."""
    document = yaml.safe_load(source.read_text(encoding="utf-8"))
    shipped = {group["name"]: seconds(group.get("interval") or EVALUATION_INTERVAL) for group in document["groups"]}
    if max_interval:
        for group in document["groups"]:
            if shipped[group["name"]] > seconds(max_interval):
                group["interval"] = max_interval
    target.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return shipped


def per_round(group: GroupResult) -> float:
    """Samples a group reads per one-minute round: all of one evaluation, once a round (a group evaluated
    every 30s counts once, as the rounds of #15 and #27 did); a group evaluated every k minutes, 1/k of it."""
    return group.samples_read * min(1.0, 60.0 / group.interval_seconds)


def per_minute(group: GroupResult) -> float:
    """Samples a group reads per minute at its shipped interval (a 30s group twice)."""
    return group.samples_read * 60.0 / group.interval_seconds


def prometheus_metrics(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, body = http_get(port, "/metrics", timeout=30.0)
    assert status == 200
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, float(sample.value)))
    return out


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def query(port: int, expr: str, at: float, instant: bool) -> tuple[float, str, int]:
    """(seconds, status, series returned) of one query as Grafana sends it."""
    if instant:
        params = {"query": expr, "time": f"{at:.3f}"}
        path = "/api/v1/query?"
    else:
        params = {"query": expr, "start": f"{at - 3600:.3f}", "end": f"{at:.3f}", "step": "60"}
        path = "/api/v1/query_range?"
    began = time.monotonic()
    status, body = http_get(port, path + urllib.parse.urlencode(params), timeout=120.0)
    took = time.monotonic() - began
    if status != 200:
        return took, f"http {status}: {body[:200]!r}", 0
    data = json.loads(body)
    return took, data.get("status", "?"), len(data.get("data", {}).get("result", []))


@dataclass
class GroupResult:
    evaluations: dict[float, float] = field(default_factory=dict)  # evaluated at -> seconds it took
    seconds: float = 0.0  # largest prometheus_rule_group_last_duration_seconds seen
    samples: float = 0.0  # prometheus_rule_group_last_evaluation_samples at that time
    rules: int = 0
    failures: float = 0.0
    missed: float = 0.0
    samples_read: int = 0  # samples its rules' queries load (Prometheus's totalQueryableSamples), one evaluation
    rule_samples_read: dict[str, int] = field(default_factory=dict)  # the same per rule (alerts: severities summed)
    interval_seconds: float = 60.0  # its shipped evaluation interval (the global one where it ships none)
    rule_seconds: dict[str, list[float]] = field(default_factory=dict)  # per rule: evaluation times seen


@dataclass
class QueryResult:
    dashboard: str
    panel: str
    ref_id: str
    seconds: float
    status: str
    series: int


@dataclass
class SizeResult:
    nodes: int
    series: int  # the fleet's series, Prometheus's per-target ones included (prometheus_tsdb_head_series)
    targets_up: int = 0
    peak_rss_bytes: int = 0
    heap_inuse_bytes: float = 0.0
    samples_per_second: float = 0.0
    appended: list[tuple[float, float]] = field(default_factory=list)
    groups: dict[str, GroupResult] = field(default_factory=dict)
    queries: list[QueryResult] = field(default_factory=list)
    wall_seconds: float = 0.0


def _rule_group(labels: dict[str, str]) -> str:
    return labels["rule_group"].split(";", 1)[1]


def _watch(port: int, result: SizeResult) -> None:
    """One look at Prometheus's own metrics: keep each group's slowest evaluation."""
    metrics = prometheus_metrics(port)
    written = {lab["rule_group"]: v for lab, v in metrics.get("prometheus_rule_group_last_evaluation_samples", [])}
    stamps = metrics.get("prometheus_rule_group_last_evaluation_timestamp_seconds", [])
    evaluated = {lab["rule_group"]: v for lab, v in stamps}
    for labels, value in metrics.get("prometheus_rule_group_last_duration_seconds", []):
        group = result.groups.setdefault(_rule_group(labels), GroupResult())
        if evaluated.get(labels["rule_group"], 0) > 0:
            group.evaluations[evaluated[labels["rule_group"]]] = value
        if value >= group.seconds:
            group.seconds, group.samples = value, written.get(labels["rule_group"], 0.0)
    for labels, value in metrics.get("prometheus_rule_group_rules", []):
        result.groups.setdefault(_rule_group(labels), GroupResult()).rules = int(value)
    for labels, value in metrics.get("prometheus_rule_group_iterations_missed_total", []):
        result.groups.setdefault(_rule_group(labels), GroupResult()).missed = value
    for labels, value in metrics.get("prometheus_rule_evaluation_failures_total", []):
        result.groups.setdefault(_rule_group(labels), GroupResult()).failures = value
    status, body = http_get(port, "/api/v1/rules", timeout=60.0)
    if status == 200:
        for listed in json.loads(body)["data"]["groups"]:
            group = result.groups.setdefault(listed["name"], GroupResult())
            for rule in listed["rules"]:
                if rule.get("lastEvaluation", "").startswith("0001"):
                    continue  # not evaluated yet
                group.rule_seconds.setdefault(rule["name"], []).append(float(rule["evaluationTime"]))
    heap = metrics.get("go_memstats_heap_inuse_bytes", [({}, 0.0)])[0][1]
    result.heap_inuse_bytes = max(result.heap_inuse_bytes, heap)
    result.series = int(max([result.series] + [v for _, v in metrics.get("prometheus_tsdb_head_series", [])]))
    appended = metrics.get("prometheus_tsdb_head_samples_appended_total", [({}, 0.0)])
    result.appended.append((time.monotonic(), sum(v for _, v in appended)))


def _look(port: int, result: SizeResult, log: Any) -> None:
    """:func:`_watch`, where a look that times out (a loaded machine) is skipped, not the run."""
    try:
        _watch(port, result)
    except (TimeoutError, OSError) as error:
        log(f"  a look at Prometheus's metrics failed ({error}); the next one counts")


def _instant(port: int, expr: str) -> float:
    status, body = http_get(port, "/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=60.0)
    result = json.loads(body)["data"]["result"] if status == 200 else []
    return float(result[0]["value"][1]) if result else 0.0


def measure_size(nodes: int, node_template: list[TemplateSeries], workdir: Path, warmup: float, cycles: float,
                 scrape_interval: int, log: Any = None, prometheus: str | None = None,
                 max_interval: str = "") -> SizeResult:
    log = log or functools.partial(print, flush=True)
    began = time.monotonic()
    prometheus = prometheus or find_binary("prometheus", "/usr/bin/prometheus")
    if prometheus is None:
        raise SystemExit("needs prometheus (Debian: apt-get install prometheus, or --prometheus PATH)")
    size_dir = workdir / f"n{nodes}"
    shutil.rmtree(size_dir, ignore_errors=True)
    size_dir.mkdir(parents=True)
    result = SizeResult(nodes, 0)
    intervals = rules_for_bench(Path(REPO_ROOT) / "alerts" / "fleetscope.rules.yml", size_dir / "rules.yml",
                                max_interval)
    group_names = list(intervals)
    for name, interval in intervals.items():
        result.groups.setdefault(name, GroupResult()).interval_seconds = interval
    with FleetServer(fleet_series(nodes, node_template)) as server:
        config = {"global": {"evaluation_interval": EVALUATION_INTERVAL}, "rule_files": [str(size_dir / "rules.yml")],
                  "scrape_configs": [scrape_config(nodes, server.port, scrape_interval)]}
        service = Prometheus(size_dir, extra_args=["--query.timeout=2m"], retention="15d", binary=prometheus)
        try:
            service.start(config, timeout=300)  # port 0: the address it logs is the one it bound
            port = service.port
            time.sleep(warmup * 60)
            log(f"  {nodes} nodes: warm after {warmup:g} min ({server.scrapes:,} scrapes served)")
            deadline = time.monotonic() + cycles * 60 + 5
            while time.monotonic() < deadline:
                _look(port, result, log)
                time.sleep(15)
            _look(port, result, log)
            result.targets_up = int(_instant(port, 'sum(up{job="fleetscope"})'))
            (t0, n0), (t1, n1) = result.appended[0], result.appended[-1]
            result.samples_per_second = (n1 - n0) / (t1 - t0)
            log(f"  {result.series:,} series, {result.targets_up} of {nodes} targets up; groups: "
                + ", ".join(f"{n} {result.groups.get(n, GroupResult()).seconds:.2f}s" for n in group_names))
            samples_read(port, size_dir / "rules.yml", result)
            log(f"  samples read per node per round: {sum(per_round(g) for g in result.groups.values()) / nodes:,.0f}")
            result.queries = dashboard_queries(port, log)
            result.peak_rss_bytes = peak_rss_bytes(service.pid)
        finally:
            service.stop()
    shutil.rmtree(size_dir / "data", ignore_errors=True)
    result.wall_seconds = time.monotonic() - began
    return result


def samples_read(port: int, rules: Path, result: SizeResult) -> None:
    """Per group, the samples its rules load in one evaluation: each rule's expression run once as an instant
    query with Prometheus's query statistics. Unlike seconds, this does not depend on the machine."""
    at = time.time()
    for group in yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]:
        measured = result.groups.setdefault(group["name"], GroupResult())
        for rule in group["rules"]:
            params = {"query": rule["expr"], "time": f"{at:.3f}", "stats": "all"}
            status, body = http_get(port, "/api/v1/query?" + urllib.parse.urlencode(params), timeout=120.0)
            if status == 200:
                read = int(json.loads(body)["data"].get("stats", {}).get("samples", {})
                           .get("totalQueryableSamples", 0))
                name = rule.get("record") or rule["alert"]
                measured.rule_samples_read[name] = measured.rule_samples_read.get(name, 0) + read
        measured.samples_read = sum(measured.rule_samples_read.values())


def dashboard_queries(port: int, log: Any = print) -> list[QueryResult]:
    from fleetscope.dashboards import QUERY_DEFAULTS, queries

    values = dict(QUERY_DEFAULTS, cluster=CLUSTER, training_job=f"job-{SLOW_JOBS[0]:02d}")
    at = time.time()
    out = []
    for item in queries(values=values):
        if item.dashboard not in FLEET_DASHBOARDS:
            continue
        took, status, count = query(port, item.expr, at, item.instant)
        out.append(QueryResult(item.dashboard, item.panel, item.ref_id, took, status, count))
    slowest = max(out, key=lambda q: q.seconds)
    log(f"  {len(out)} dashboard queries, slowest {slowest.seconds:.2f}s ({slowest.dashboard}: {slowest.panel})")
    return out


# -- report ---------------------------------------------------------------------------------------------


def _growth(results: list[SizeResult], value: Any) -> str:
    first, last = value(results[0]), value(results[-1])
    if not first or len(results) < 2:
        return "—"
    nodes = results[-1].nodes / results[0].nodes
    return f"{last / first:.1f}× ({nodes:.0f}× nodes)"


def load_result(item: dict[str, Any]) -> SizeResult:
    """A :class:`SizeResult` back from its ``--json`` form."""
    groups = {name: GroupResult(**{**g, "evaluations": {float(k): v for k, v in g["evaluations"].items()}})
              for name, g in item["groups"].items()}
    queries = [QueryResult(**q) for q in item["queries"]]
    appended = [tuple(pair) for pair in item["appended"]]
    return SizeResult(**{**item, "groups": groups, "queries": queries, "appended": appended})


def median(group: GroupResult) -> float:
    values = sorted(group.evaluations.values())
    return values[len(values) // 2] if values else group.seconds


def render(results: list[SizeResult], date: str, machine: str, wall_seconds: float, warmup: float,
           scrape_interval: int) -> str:
    lines: list[str] = []
    add = lines.append
    sizes = " | ".join(f"{r.nodes:,} nodes" for r in results)
    add("# Fleet-scale benchmark")
    add("")
    add(f"Generated by `python3 benchmarks/fleet.py --nodes {','.join(str(r.nodes) for r in results)}` "
        f"(see its docstring for the method); do not edit by hand. Run on {date}, {wall_seconds / 60:.0f} min wall "
        f"time, on {machine}.")
    add("")
    add(f"A synthetic fleet of p5 nodes at the default detail level ({JOBS} jobs, {RANKS_PER_NODE} ranks per node, "
        f"two jobs with a slow rank, one hot GPU, one node dropping EFA packets), each node a target scraped every "
        f"{scrape_interval} s by a real Prometheus, which evaluates every group of `alerts/fleetscope.rules.yml` "
        f"at its shipped interval (1 minute where it ships none); measured after {warmup:g} minutes of scrapes.")
    add("")
    add(f"| | {sizes} | growth |")
    add("|---|" + "---:|" * len(results) + "---:|")

    def row(title: str, value: Any, fmt: str) -> None:
        cells = " | ".join(format(value(r), fmt) for r in results)
        add(f"| {title} | {cells} | {_growth(results, value)} |")

    row("GPUs", lambda r: r.nodes * 8, ",")
    row("series", lambda r: r.series, ",")
    row("targets up", lambda r: r.targets_up, ",")
    row("samples appended per second", lambda r: r.samples_per_second, ",.0f")
    row("Prometheus peak RSS (MiB)", lambda r: r.peak_rss_bytes / 2**20, ",.0f")
    row("Prometheus heap in use, largest (MiB)", lambda r: r.heap_inuse_bytes / 2**20, ",.0f")
    row("all groups, one evaluation, median (s)", lambda r: sum(median(g) for g in r.groups.values()), ".2f")
    row("**samples read per node per round**", lambda r: sum(per_round(g) for g in r.groups.values()) / r.nodes,
        ",.0f")
    row("samples read per node per minute at the shipped intervals",
        lambda r: sum(per_minute(g) for g in r.groups.values()) / r.nodes, ",.0f")
    add("")
    add("A round is one minute, the benchmark's evaluation interval: every group's evaluation once (a group "
        "evaluated every 30 s counts once, as in #15 and #27), a group evaluated every k minutes 1/k of one. "
        "Samples read are each rule's expression run as a query with Prometheus's statistics "
        "(`totalQueryableSamples`); windows longer than the run (the 10m, 1h, 24h and 7d ones) hold only the "
        "minutes of the run.")
    add("")
    add("## Rule groups")
    add("")
    add("Evaluation time is `prometheus_rule_group_last_duration_seconds`, the median and the largest of the "
        "evaluations watched (growth: of the medians). Samples read are what the group's rules load in one "
        "evaluation (each rule's expression run as a query with Prometheus's statistics, "
        "`totalQueryableSamples`): the work itself, the same on any machine. Series written are "
        "`prometheus_rule_group_last_evaluation_samples`. "
        "Target: ≤ 1 s per group at 2,048 nodes, growth no worse than linear. Groups run concurrently with "
        "each other, with ingestion and with the target server: on a shared 2-core machine a group's wall time is "
        "partly waiting for a core, so compare samples read, growth and the groups' order more than absolute "
        "seconds. Where the groups' times add up to more than the minute they share (missed: "
        "`prometheus_rule_group_iterations_missed_total` per size), the machine was saturated.")
    add("")
    add("| group | rules | interval | " + " | ".join(f"s at {r.nodes:,} (median, max)" for r in results) + " | "
        + " | ".join(f"samples read at {r.nodes:,}" for r in results) + " | "
        + " | ".join(f"series written at {r.nodes:,}" for r in results)
        + " | " + " | ".join(f"read per node per round at {r.nodes:,}" for r in results)
        + " | time growth | read growth | failures | missed |")
    add("|---|---:|---:|" + "---:|" * (4 * len(results)) + "---:|---:|---:|---:|")
    names = list(results[-1].groups)
    for name in names:
        groups = [r.groups.get(name, GroupResult()) for r in results]
        times = " | ".join(f"{median(g):.3f}, {g.seconds:.3f}" for g in groups)
        read = " | ".join(f"{g.samples_read:,}" for g in groups)
        samples = " | ".join(f"{g.samples:,.0f}" for g in groups)
        node_reads = " | ".join(f"{per_round(g) / r.nodes:,.1f}" for g, r in zip(groups, results, strict=True))
        interval = f"{groups[-1].interval_seconds:g} s"
        growth = _growth(results, lambda r, n=name: median(r.groups.get(n, GroupResult())))
        read_growth = _growth(results, lambda r, n=name: r.groups.get(n, GroupResult()).samples_read)
        failures = sum(g.failures for g in groups)
        missed = " / ".join(f"{g.missed:.0f}" for g in groups)
        add(f"| `{name}` | {groups[-1].rules} | {interval} | {times} | {read} | {samples} | {node_reads} | {growth} | "
            f"{read_growth} | {failures:.0f} | {missed} |")
    add("")
    last = results[-1]
    reads = [(per_round(GroupResult(samples_read=n, interval_seconds=g.interval_seconds)) / last.nodes, group, rule)
             for group, g in last.groups.items() for rule, n in g.rule_samples_read.items()]
    if reads:
        add(f"Where the reads go at {last.nodes:,} nodes: the rules that read the most samples per node per round "
            "(an alert with two severities is one line).")
        add("")
        add("| rule | group | samples per node per round |")
        add("|---|---|---:|")
        for per_node, group, rule in sorted(reads, reverse=True)[:15]:
            add(f"| `{rule}` | `{group}` | {per_node:,.1f} |")
        add("")
    rules = [(sorted(seen)[len(seen) // 2], max(seen), group, rule) for group, g in last.groups.items()
             for rule, seen in g.rule_seconds.items() if seen]
    if rules:
        add(f"Where the time goes at {last.nodes:,} nodes: the slowest rules (`/api/v1/rules` evaluation time, "
            "median and largest of the evaluations watched; an alert with two severities is one line).")
        add("")
        add("| rule | group | s (median) | s (max) |")
        add("|---|---|---:|---:|")
        for mid, most, group, rule in sorted(rules, reverse=True)[:12]:
            add(f"| `{rule}` | `{group}` | {mid:.3f} | {most:.3f} |")
        add("")
    add("## Fleet and job dashboards")
    add("")
    add(f"Every query of {', '.join(f'`{d}`' for d in FLEET_DASHBOARDS)} as Grafana sends it (1 h range at 60 s "
        "steps, or instant), `cluster` and one `training_job` selected. Target: ≤ 2 s at 2,048 nodes.")
    add("")
    add("| | " + sizes + " |")
    add("|---|" + "---:|" * len(results))
    add("| queries | " + " | ".join(str(len(r.queries)) for r in results) + " |")
    add("| slowest (s) | " + " | ".join(f"{max(q.seconds for q in r.queries):.2f}" for r in results) + " |")
    add("| median (s) | " + " | ".join(f"{sorted(q.seconds for q in r.queries)[len(r.queries) // 2]:.3f}"
                                       for r in results) + " |")
    add("| errors | " + " | ".join(str(sum(q.status != 'success' for q in r.queries)) for r in results) + " |")
    add("")
    last = results[-1]
    add(f"Slowest queries at {last.nodes:,} nodes:")
    add("")
    add("| dashboard | panel | s | series |")
    add("|---|---|---:|---:|")
    for q in sorted(last.queries, key=lambda q: -q.seconds)[:8]:
        add(f"| {q.dashboard} | {q.panel} ({q.ref_id}) | {q.seconds:.2f} | {q.series} |")
    add("")
    return "\n".join(lines)


def machine() -> str:
    model = "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo", encoding="ascii") as handle:
        memory = int(handle.readline().split()[1]) / 2**20
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, {memory:.0f} GiB memory, shared (load average {load} at the end)"


def load_template(path: Path) -> list[TemplateSeries]:
    """A node saved by ``--write-template``: its clocks are ages from when it was taken, not from now."""
    saved = path.read_text(encoding="utf-8")
    if not saved.startswith(TAKEN_AT):
        raise SystemExit(f"{path} is not a --write-template file")
    first, _, rest = saved.partition("\n")
    return template(rest, taken=float(first[len(TAKEN_AT):]))


def outputs(out: str, json_path: str) -> tuple[Path, Path | None]:
    """Where the report (and the raw results) go: ``--out`` a file, or a directory (existing, or named with a
    trailing slash) that gets ``benchmarks-fleet.md`` and ``fleet.json``."""
    if out.endswith("/") or Path(out).is_dir():
        directory = Path(out)
        directory.mkdir(parents=True, exist_ok=True)
        return directory / "benchmarks-fleet.md", Path(json_path) if json_path else directory / "fleet.json"
    return Path(out), Path(json_path) if json_path else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/fleet.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", default="512,1024,2048", help="Fleet sizes, comma-separated.")
    parser.add_argument("--warmup", type=float, default=6.0, help="Minutes of scrapes before measuring (default 6: "
                        "the 5m windows full).")
    parser.add_argument("--scrape-interval", type=int, default=30, help="Seconds between scrapes of a node.")
    parser.add_argument("--cycles", type=float, default=4, help="Minutes of rule evaluations to watch per size.")
    parser.add_argument("--max-interval", default="", help="Evaluate groups shipped slower than this (2m, 3m, 10m) "
                        "this often, so a short run times each with its windows full (samples read per round still "
                        "count them at their shipped interval).")
    parser.add_argument("--template", default="", help="One p5 node's scrape saved by --write-template (no "
                        "simulator needed where the benchmark runs).")
    parser.add_argument("--write-template", default="", help="Save one simulated p5 node's scrape here and exit.")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "docs", "benchmarks-fleet.md"),
                        help="The report's file, or a directory for the report and the raw results (fleet.json).")
    parser.add_argument("--json", default="", help="Also write the raw results here.")
    parser.add_argument("--prometheus", default="", help="The prometheus binary (default: /usr/bin/prometheus, PATH).")
    parser.add_argument("--date", default="", help="With --from-json: when that run was made.")
    parser.add_argument("--from-json", default="", help="Render the report from a --json file of an earlier run.")
    parser.add_argument("--workdir", default="", help="Where Prometheus's data go (default: a temporary directory).")
    args = parser.parse_args(argv)
    began = time.monotonic()
    report, raw = outputs(args.out, args.json)
    if args.from_json:
        loaded = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        done = [load_result(item) for item in loaded]
        wall = sum(r.wall_seconds for r in done)
        where = machine().split(", shared")[0] + ", shared with other work"
        text = render(done, args.date or "an earlier run", where, wall, args.warmup, args.scrape_interval)
        report.write_text(text, encoding="utf-8")
        return 0
    if args.write_template:
        with tempfile.TemporaryDirectory() as scratch:
            text = scrape_p5_node(Path(scratch), "default")
        # When it was taken: the clocks in it (last push, phase start) are read as ages from then.
        Path(args.write_template).write_text(f"{TAKEN_AT}{time.time():.3f}\n{text}", encoding="utf-8")
        return 0
    prometheus = args.prometheus or find_binary("prometheus", "/usr/bin/prometheus")
    if not prometheus or not os.access(prometheus, os.X_OK):
        raise SystemExit(f"needs an executable prometheus (--prometheus PATH), not {prometheus!r}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fleetscope-fleet-"))
    if args.template:
        node_template = load_template(Path(args.template))
    else:
        with tempfile.TemporaryDirectory() as scratch:
            node_template = template(scrape_p5_node(Path(scratch), "default"))
    print(f"template: {len(node_template)} series per node", flush=True)
    results = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        results.append(measure_size(nodes, node_template, workdir, args.warmup, args.cycles, args.scrape_interval,
                                    prometheus=prometheus, max_interval=args.max_interval))
        if raw is not None:
            raw.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1), encoding="utf-8")
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = render(results, date, machine(), time.monotonic() - began, args.warmup, args.scrape_interval)
    report.write_text(text, encoding="utf-8")
    print(text)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

