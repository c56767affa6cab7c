"""The simulated cluster in virtual time: observed through the product's own readers, no sleeping, no sockets.

A live run (:class:`~fleetscope_sim.cluster.SimCluster` with a daemon process per node and a real
Prometheus) depends on the machine keeping up. Here the same models tick over a fixed 1 s grid as fast as
the CPU goes, and every simulated node is observed in this process by what a node's daemon runs:

* its kernel trees (sysfs, procfs, the kernel log, NCCL Inspector files), written by the same tree writer,
  are read by the registry's collectors and their sources; ENA statistics come through the ENA
  collector's reader seam, as in a node process (:func:`~fleetscope_sim.nodeproc.build_node_collectors`);
* its GPUs are an NVML fake of its own under a copy of the real ``pynvml`` binding of its own
  (:func:`~fleetscope_sim.nvml_fake.private_binding`), fed from the node's ``gpu.json`` by
  :class:`~fleetscope_sim.gpufeed.GpuFeed`; NVML events are waited for until handled
  (:meth:`~fleetscope_sim.nvml_fake.FakeNvml.settle`) before the collection that must see them;
* its ranks' reports are the bodies ``fleetscope.client`` sends once a second (the rank's fields, its completed
  steps, its position), validated by the push API's own parser and stored in the node's
  :class:`~fleetscope.push.store.StepStore`, whose clock is the virtual one;
* each background collector runs in the engine's own :class:`~fleetscope.serve.engine.CollectorRunner`, once per
  collection interval of virtual time, right after the node's tree was written (a daemon reads no more
  often), in this thread (the runner's ``timeout=None``: no deadline in a time that stands still); the scrape
  is the engine's exposition, parsed back into samples.

Every 5 s of virtual time every node is scraped; :class:`Recording` keeps the samples as Prometheus would
(target labels ``job``, ``instance``, ``instance_type``, ``up``, a staleness marker where a series ends)
and writes them as promtool ``input_series``, Unix times counted from the run's start (promtool's time 0).
:func:`run_promtool` then evaluates the rules over them: what fired, and when, is promtool's answer, the
same on every run.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import yaml

from fleetscope.clock import Now
from fleetscope_sim.cluster import ClusterSpec, SimCluster, SimNode
from fleetscope_sim.detection import AlertPattern, Expectation, Sighting
from fleetscope_sim.training import JobSpec, Position

SCRAPE = 5.0  # what the e2e Prometheus scraped and evaluated at
TICK = 1.0
STALE = "stale"
_UNSEEN: Any = object()


class VirtualClock:
    """The run's two clocks, moved only by the run: Unix time ``epoch + elapsed`` and a monotonic reading.

    The epoch is the system clock's time when the run begins (by default), as the files the simulator writes
    carry the system clock's mtimes: the NCCL Inspector reader skips files older than its TTL (900 s) on its
    clock, so a run whose virtual time stays within that of the real one reads them as a node would."""

    def __init__(self, epoch: float, monotonic: float = 100_000.0) -> None:
        self.epoch = epoch
        self.elapsed = 0.0
        self._monotonic0 = monotonic

    def set(self, elapsed: float) -> None:
        if elapsed < self.elapsed:
            raise ValueError("virtual time only runs forward")
        self.elapsed = elapsed

    def time(self) -> float:
        return self.epoch + self.elapsed

    def monotonic(self) -> float:
        return self._monotonic0 + self.elapsed

    def read(self) -> Now:
        return Now(self.time(), self.monotonic())


class WirePusher:
    """Each simulated rank's reports as ``fleetscope.client`` sends them, into its node's store in process.

    Once a second a rank's client sends one report body: the rank's fields, the steps it completed since the
    last one, and its position (the open step, its phase, since when). The body goes through the push API's
    own validation (:func:`fleetscope.push.models.parse_report`) and the node's store ingests it at the
    virtual time of the tick. A rank whose process died sends nothing more, without a goodbye.
    """

    def __init__(self, stores: Mapping[str, Any], clock: VirtualClock,
                 process_of: Callable[[str, int], tuple[int, int] | None]) -> None:
        self._stores = stores
        self._clock = clock
        self._process_of = process_of
        self._fields: dict[tuple[str, int], dict[str, Any]] = {}
        self._pending: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        self._where: dict[tuple[str, int], tuple[str, Position]] = {}
        self._dead: set[tuple[str, int]] = set()

    def _rank_fields(self, job: JobSpec, rank: int) -> dict[str, Any]:
        key = (job.name, rank)
        fields = self._fields.get(key)
        if fields is None:
            local = rank % job.ranks_per_node
            process = self._process_of(job.name, rank)
            pid, start_time = process if process is not None else (None, None)
            fields = self._fields[key] = {
                "job": job.name, "rank": rank, "local_rank": local, "world_size": job.world_size, "pp_stage": 0,
                "dp_rank": rank, "gpu": local, "pid": pid, "start_time": start_time,
                "session": zlib.crc32(f"{job.name}/{rank}".encode()) + 1,  # a process's random id; fixed here
                "lease": f"virtual-{job.name}-{rank}-{pid}",  # the process's secret (random in the client)
            }
        return fields

    def steps(self, node: str, job: JobSpec, records: list[dict[str, Any]]) -> None:
        for record in records:
            key = (job.name, int(record["rank"]))
            if key in self._dead:
                continue
            self._rank_fields(job, key[1])
            # What StepTracker.report() buffers for one step.
            self._pending[key].append({
                "step": record["step"], "step_seconds": record["step_seconds"], "timestamp": record["timestamp"],
                "data_seconds": record["data_seconds"], "compute_seconds": record["compute_seconds"],
                "comm_seconds": record["comm_seconds"], "tokens": record["tokens"], "samples": record["samples"],
                "loss": record["loss"],
            })

    def position(self, node: str, job: JobSpec, rank: int, where: Position | None) -> None:
        key = (job.name, rank)
        if key in self._dead:
            return
        if where is None:
            self._dead.add(key)
            self._pending.pop(key, None)
            self._where.pop(key, None)
            return
        self._rank_fields(job, rank)
        self._where[key] = (node, where)

    def flush(self) -> None:
        """Every live rank's report of this second, as its sender would deliver it."""
        from fleetscope.push.models import parse_report

        by_node: dict[str, list[Any]] = defaultdict(list)
        for key, (node, where) in self._where.items():
            position = {"step": where.step, "phase": where.phase, "since": self._clock.epoch + where.since}
            body = {**self._fields[key], "steps": self._pending.pop(key, []), "position": position}
            by_node[node].append(parse_report(json.dumps(body, allow_nan=True).encode()))
        for node, reports in by_node.items():
            self._stores[node].ingest(reports)

    def close(self) -> None:
        self._pending.clear()


class VirtualNode:
    """One simulated node's daemon, minus its HTTP server: the registry's collectors in the engine's runners."""

    def __init__(self, node: SimNode, clock: VirtualClock, interval: float,
                 settings: Mapping[str, Any] | None = None) -> None:
        from fleetscope.collectors import REGISTRY
        from fleetscope.collectors.gpu import GpuCollector
        from fleetscope.collectors.nccl import NcclCollector
        from fleetscope.collectors.steps import StepsCollector
        from fleetscope.serve.engine import CollectorRunner, Engine, LiveCollector
        from fleetscope_sim.gpufeed import GpuFeed
        from fleetscope_sim.nodeproc import build_node_collectors, node_config

        self.name = node.spec.name
        self.labels = {"instance": self.name, "instance_type": node.spec.profile.instance_type, "job": "fleetscope"}
        self.config = config = node_config(node.paths, "127.0.0.1:0", interval, settings)
        self.feed = GpuFeed(node.paths)
        self.feed.install(private=True)
        collectors = build_node_collectors(config, node.paths)
        # The collectors that read a clock read the virtual one; the GPU collector talks to this node's NVML.
        if "gpu" in collectors:
            collectors["gpu"] = GpuCollector(config, clock=clock.monotonic, wall=clock.time,
                                             nvml_binding=self.feed.binding)
        if "nccl" in collectors:
            collectors["nccl"] = NcclCollector(config, clock=clock.time)
        self.steps = StepsCollector(config, clock=clock)
        if "steps" in collectors:
            collectors["steps"] = self.steps
        self.collectors = collectors
        self.runners: list[CollectorRunner] = []
        live: list[LiveCollector] = []
        for name, collector in collectors.items():
            if REGISTRY[name].live:
                live.append(LiveCollector(name, collector, clock=clock.time))
            else:
                settings_of = config.collector(name)
                self.runners.append(CollectorRunner(
                    name, collector, settings_of.interval, None, config.staleness_for(name),
                    clock=clock.time, pausable=False))
        self.engine = Engine([*self.runners, *live])

    def collect(self) -> None:
        """One collection of every background collector, after the GPUs took the node's new state."""
        fake = self.feed.fake
        self.feed.refresh(force=True)
        if not fake.settle():
            raise RuntimeError(f"{self.name}: NVML event watchers did not take their events within 10 s")
        for runner in self.runners:
            runner.run_once()  # in this thread, without a deadline: virtual time stands still while it runs
        if not fake.settle():  # a first collection starts the event watchers: they are waiting before it returns
            raise RuntimeError(f"{self.name}: NVML event watchers did not start within 10 s")

    def scrape(self) -> str:
        from fleetscope.serve.exposition import negotiate

        body = self.engine.exposition(negotiate("text/plain; version=0.0.4"), compressed=False)
        assert body is not None
        return body.decode("utf-8")

    def close(self) -> None:
        self.engine.stop()


_SAMPLE_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \S+)?$")
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_exposition(text: str, keep: Callable[[str], bool]) -> Iterable[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample of a kept name in a classic text-format exposition (version
    0.0.4, what the daemon renders for it); an empty label value is an absent label, as Prometheus stores it.

    prometheus_client's parser reads every line the same way, at several times the cost; over a run of
    thousands of scrapes it was most of the run's CPU."""
    for name, inner, value in _sample_lines(text):
        if keep(name):
            yield name, _labels(inner), float(value)


def _sample_lines(text: str) -> Iterable[tuple[str, str, str]]:
    """(name, the text between the braces, value text) of every sample line."""
    for line in text.split("\n"):
        if not line or line[0] == "#":
            continue
        match = _SAMPLE_LINE.match(line)
        if match is None:
            raise ValueError(f"not a sample line: {line!r}")
        name, inner, value = match.groups()
        yield name, inner or "", value


def _labels(inner: str) -> dict[str, str]:
    labels = {}
    for key, raw in _LABEL_PAIR.findall(inner):
        if raw:
            labels[key] = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], raw) if "\\" in raw else raw
    return labels


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series_key(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


@dataclass
class Recording:
    """Every scraped sample on the scrape grid, as Prometheus stored it; promtool ``input_series`` on demand."""

    epoch: float
    scrape: float = SCRAPE
    keep: Callable[[str], bool] = lambda name: True
    series: dict[str, list[float | str | None]] = field(default_factory=dict)
    scrapes: int = 0
    _keys: dict[tuple[str, str, str], tuple[str, bool] | None] = field(default_factory=dict, repr=False)

    def add_scrape(self, targets: Iterable[tuple[Mapping[str, str], str]]) -> None:
        """One scrape of every target: (target labels, exposition text in the classic format)."""
        index = self.scrapes
        seen: set[str] = set()
        for target, text in targets:
            who = series_key("up", target)
            self._put(seen, index, who, 1.0)
            for name, inner, value in _sample_lines(text):
                # A series' line reads the same on every scrape: its key is worked out once.
                cache = (who, name, inner)
                known = self._keys.get(cache, _UNSEEN)
                if known is _UNSEEN:
                    known = self._keys[cache] = self._key(target, name, inner)
                if known is None:
                    continue
                key, timestamp = known
                number = float(value)
                # Unix time on promtool's clock, which starts at the run's start.
                self._put(seen, index, key, number - self.epoch if timestamp and number > 0 else number)
        for key, values in self.series.items():  # a series gone from its target: Prometheus marks it stale
            if key not in seen:
                values.append(STALE if values and isinstance(values[-1], float) else None)
        self.scrapes += 1

    def _key(self, target: Mapping[str, str], name: str, inner: str) -> tuple[str, bool] | None:
        """The stored series of a sample line (None: no rule reads its name) and whether its value is a time."""
        if not self.keep(name):
            return None
        labels = _labels(inner)
        for clash in [k for k in labels if k in target]:
            labels[f"exported_{clash}"] = labels.pop(clash)
        labels.update(target)
        return series_key(name, labels), name.endswith("_timestamp_seconds")

    def _put(self, seen: set[str], index: int, key: str, value: float) -> None:
        values = self.series.get(key)
        if values is None:
            values = self.series[key] = [None] * index
        if key not in seen:
            values.append(value)
            seen.add(key)

    def input_series(self) -> list[dict[str, str]]:
        return [{"series": key, "values": _values(values)} for key, values in sorted(self.series.items())]

    @property
    def end(self) -> float:
        return (self.scrapes - 1) * self.scrape


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(round(value, 9)) if value != int(value) else str(int(value))


def _values(values: Sequence[float | str | None]) -> str:
    """promtool's notation, runs of one value compressed (``5x3`` is four fives; ``_`` no sample)."""
    out: list[str] = []
    i = 0
    while i < len(values):
        value = values[i]
        j = i
        while j + 1 < len(values) and values[j + 1] == value and isinstance(value, float):
            j += 1
        if value is None:
            out.append("_")
        elif isinstance(value, str):
            out.append(value)
        elif j > i:
            out.append(f"{_number(value)}x{j - i}")
        else:
            out.append(_number(value))
        i = j + 1
    return " ".join(out)


def _rule_groups(rule_files: Sequence[str]) -> Iterable[dict[str, Any]]:
    for path in rule_files:
        with open(path, encoding="utf-8") as handle:
            document = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # the C loader, safe
        if document.get("kind") == "PrometheusRule":
            document = document["spec"]
        yield from document["groups"]


def rule_names(rule_files: Sequence[str]) -> set[str]:
    """The metric names the rules read (a series no rule reads cannot change what fires)."""
    names = {"up"}
    for group in _rule_groups(rule_files):
        for rule in group["rules"]:
            names.update(re.findall(r"\bfleetscope_[a-zA-Z0-9_]+", rule["expr"]))
    return names


def group_order(rule_files: Sequence[str]) -> list[str]:
    """Every rule group's name, in the order of the files: the order promtool is told to evaluate them in.

    Without it promtool evaluates the groups of one evaluation time in Go's random map order (its groups all
    sort equal), so an alert that reads a record of another group sees that record's value of this evaluation
    or of the one before, one evaluation apart from run to run over the very same input."""
    return [group["name"] for group in _rule_groups(rule_files)]


class VirtualCluster(SimCluster):
    """A :class:`SimCluster` whose nodes are observed in process (see the module's docstring)."""

    atomic_trees = False  # read only between ticks, in this thread: every tree file written in place from the start

    def __init__(self, spec: ClusterSpec, workdir: str, epoch: float | None = None,
                 keep: Callable[[str], bool] = lambda name: True) -> None:
        self.clock = VirtualClock(float(int(time.time())) if epoch is None else epoch)
        super().__init__(spec, workdir, wall=self.clock.time)
        self.written: list[str] = []
        self.virtual: dict[str, VirtualNode] = {}
        self.recording = Recording(self.clock.epoch, SCRAPE, keep)
        self.wire: WirePusher | None = None
        self.started_at = self.clock.epoch
        self._clock_started = True

    @property
    def elapsed(self) -> float:
        return self.clock.elapsed

    def _trees_due(self, elapsed: float) -> list[str]:
        """The live schedule (each node once per collection interval, staggered), less the collections no scrape
        would see: a node's tree is written, and read, when its next collection would come after the next
        scrape. What a scrape reads is then what it would read from a daemon collecting on schedule."""
        due = super()._trees_due(elapsed)
        scrape_at = math.ceil(elapsed / SCRAPE - 1e-9) * SCRAPE
        self.written = [name for name in due if math.ceil(self._next_tree_write[name] / TICK - 1e-9) * TICK > scrape_at]
        return self.written

    def build(self) -> None:
        super().build()
        settings = dict(self.spec.daemon_settings)
        self.virtual = {name: VirtualNode(node, self.clock, self.spec.collector_interval, settings)
                        for name, node in self.nodes.items()}
        self.wire = WirePusher({name: v.steps.store for name, v in self.virtual.items()}, self.clock,
                               self._process_of)
        self.pusher = self.wire

    def run(self, duration: float | None = None, on_tick: Callable[[float], None] | None = None) -> None:
        """Tick over the 1 s grid to ``duration`` (inclusive), collecting and scraping on schedule; no sleeping."""
        if not self.virtual:
            self.build()
        assert self.wire is not None and duration is not None
        steps = round(duration / TICK)
        per_scrape = round(SCRAPE / TICK)
        for step in range(steps + 1):
            now = step * TICK
            self.clock.set(now)
            self.tick(now, TICK if step else 0.0)
            self.wire.flush()
            for name in (self.virtual if step == 0 else self.written):  # every node collects as its daemon starts
                self.virtual[name].collect()
            if step % per_scrape == 0:
                self.recording.add_scrape((v.labels, v.scrape()) for v in self.virtual.values())
            if on_tick is not None:
                on_tick(now)

    def stop(self) -> None:
        # All at once: a node's NVML event watchers end when their wait times out (as on a real node), half a
        # second each, 8 s of waiting for the 16-node run one node after another.
        with ThreadPoolExecutor(max_workers=max(1, len(self.virtual))) as pool:
            list(pool.map(VirtualNode.close, self.virtual.values()))
        super().stop()


# -- promtool --------------------------------------------------------------------------------------------------


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        raise FileNotFoundError("promtool not found (apt-get install prometheus, or a Prometheus release)")
    return binary


def promtool_test_rules(path: str | os.PathLike[str], *, timeout: float = 600,
                        cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool test rules PATH``, its output captured. Go collects its heap when it has grown to five times what
    survived the last collection (GOGC=400; a GOGC the environment sets wins) instead of twice: a unit test's
    series take tens of MB, and at the default a sixth of promtool's CPU was garbage collection
    (tests/alerts/offenders.test.yml: 25.5 CPU-s and 118 MB resident at the default, 21.5 CPU-s and 210 MB here)."""
    env = {**os.environ, "GOGC": os.environ.get("GOGC", "400")}
    return subprocess.run([promtool(), "test", "rules", os.fspath(path)], capture_output=True, text=True,
                          check=False, timeout=timeout, cwd=cwd, env=env)


@dataclass
class PromtoolResult:
    output: str
    first_firing: dict[tuple[tuple[str, str], ...], float]  # alert labels -> first firing, seconds after start
    failed: dict[str, str]  # expression of a check that failed -> what promtool said of it

    @property
    def ok(self) -> bool:
        return not self.failed


FIRST_FIRING = 'min_over_time(timestamp(ALERTS{{alertstate="firing"}})[{end}s:{step}s])'
_BLOCK = re.compile(r'^\s*expr: ("(?:[^"\\]|\\.)*"), time: ', re.M)
_SAMPLE = re.compile(r'(\{[^{}]*\})\s+([0-9.eE+-]+|NaN|[+-]Inf)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def first_firings(recording: Recording, rule_files: Sequence[str], workdir: str,
                  checks: Sequence[Mapping[str, Any]] = ()) -> PromtoolResult:
    """When every alert first fired, as promtool evaluates ``rule_files`` over the recording, and which of
    ``checks`` (further ``promql_expr_test`` entries) failed.

    promtool prints what an expression test got when it differs from what it expected: the first-firing
    query expects nothing, so its answer is in the output, one ALERTS series each."""
    end = recording.end
    query = FIRST_FIRING.format(end=f"{end:.0f}", step=f"{recording.scrape:.0f}")
    tests = [{"expr": query, "eval_time": f"{end:.0f}s", "exp_samples": []}, *checks]
    document = {
        "rule_files": [os.path.abspath(p) for p in rule_files],
        "evaluation_interval": f"{recording.scrape:.0f}s",
        "group_eval_order": group_order(rule_files),
        "tests": [{"interval": f"{recording.scrape:.0f}s", "input_series": recording.input_series(),
                   "promql_expr_test": tests}],
    }
    path = os.path.join(workdir, "virtual.test.yml")
    with open(path, "w", encoding="utf-8") as handle:
        # JSON is YAML to promtool, and written at a small part of a YAML emitter's cost.
        json.dump(document, handle, indent=0)
    result = promtool_test_rules(path)
    output = result.stdout + result.stderr
    failures = _failures(output)
    if result.returncode != 0 and not failures:
        raise RuntimeError(f"promtool could not run the recording: {output[-3000:]}")
    got = failures.pop(query, "")
    first: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in _SAMPLE.findall(got.split("got:", 1)[-1]):
        key = tuple(sorted((k, json.loads(f'"{v}"')) for k, v in _LABEL.findall(labels)))
        first[key] = float(value)
    return PromtoolResult(output, first, failures)


def _failures(output: str) -> dict[str, str]:
    """expression -> promtool's account of it, for every failed expression test in ``output``."""
    marks = list(_BLOCK.finditer(output))
    out = {}
    ends = [m.start() for m in marks[1:]] + [len(output)]
    for mark, end in zip(marks, ends[:len(marks)], strict=True):
        out[json.loads(mark.group(1))] = output[mark.end():end].strip()
    return out


def sightings(first: Mapping[tuple[tuple[str, str], ...], float], epoch: float) -> list[Sighting]:
    """The first firings as the live watcher's sightings (Unix times)."""
    return [Sighting({k: v for k, v in labels if k != "alertstate"}, epoch + at) for labels, at in first.items()]


def fired_within(expectations: Sequence[Expectation], end: float) -> list[dict[str, Any]]:
    """promtool expression tests: each expected alert fires between its fault's start and ``fault.at + within``."""
    checks = []
    for exp in expectations:
        for pattern in exp.expected:
            window = min(exp.within, end - exp.fault.at)
            checks.append({
                "expr": f"group(max_over_time({alerts_selector(pattern)}[{window + 1:.0f}s]))",
                "eval_time": f"{exp.fault.at + window:.0f}s",
                "exp_samples": [{"labels": "{}", "value": 1}],
            })
    return checks


def alerts_selector(pattern: AlertPattern, state: str = "firing") -> str:
    matchers = [f'alertname="{pattern.alertname}"', f'alertstate="{state}"']
    for key, want in sorted(pattern.labels.items()):
        if isinstance(want, tuple):
            matchers.append(f'{key}=~"{"|".join(re.escape(w) for w in want)}"')
        else:
            matchers.append(f'{key}="{_escape(want)}"')
    return "ALERTS{" + ", ".join(matchers) + "}"


@dataclass
class VirtualRun:
    """One virtual-time run of a cluster and promtool's verdict over it."""

    spec: ClusterSpec
    duration: float
    recording: Recording
    result: PromtoolResult
    wall_seconds: float
    series: int

    @property
    def sightings(self) -> list[Sighting]:
        return sightings(self.result.first_firing, self.recording.epoch)


def simulate(spec: ClusterSpec, duration: float, rule_files: Sequence[str],
             checks: Callable[[Recording], Sequence[Mapping[str, Any]]] | None = None,
             workdir: str | None = None) -> VirtualRun:
    """Run ``spec`` for ``duration`` s of virtual time and evaluate ``rule_files`` over it with promtool."""
    from fleetscope_sim.tree import make_workdir

    started = time.perf_counter()
    names = rule_names(rule_files)
    base = workdir or make_workdir("fleetscope-virtual-")
    try:
        cluster = VirtualCluster(spec, os.path.join(base, "cluster"), keep=names.__contains__)
        try:
            cluster.build()
            cluster.run(duration)
        finally:
            cluster.stop()
        recording = cluster.recording
        result = first_firings(recording, rule_files, base, checks(recording) if checks else ())
    finally:
        if workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    return VirtualRun(spec, duration, recording, result, time.perf_counter() - started, len(recording.series))


def scratch() -> str:
    return tempfile.mkdtemp(prefix="fleetscope-virtual-")
