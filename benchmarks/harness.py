"""Building blocks of the benchmarks: simulated node trees, processes under measurement, HTTP load.

Everything here is bounded: every loop has a count limit and a deadline, and
every process started is stopped by the object that started it (by its own
pid). Only loopback addresses are used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from fleetscope_sim.harness import Daemon, GoServer, Pushgateway

HOST = "127.0.0.1"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")

# The Accept headers Prometheus scrapes with (scrape/scrape.go), OpenMetrics first, always with
# Accept-Encoding: gzip. 2.x before scrape_protocols (up to 2.48; Debian's 2.42 sends this):
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
# 3.x default scrape_protocols, UTF-8 names allowed:
PROMETHEUS_3_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)

# The daemon with every collector, and with the network ones only (what node_exporter also reads).
ALL_COLLECTORS = ("efa", "netdev", "netstat", "ena", "gpu", "steps")
NET_COLLECTORS = ("efa", "netdev", "netstat", "ena")


# -- statistics ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# -- simulated node trees ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeShape:
    """A p5.48xlarge-like node, with the counts the scaling runs vary."""

    label: str
    gpus: int = 8
    efa: int = 32
    ena: int = 4
    ranks: int = 8  # 0: nothing pushes

    def profile(self) -> Any:
        from fleetscope_sim.profiles import P5

        if not 1 <= self.gpus <= P5.gpu_count or not 1 <= self.efa <= P5.efa_count:
            raise ValueError(f"{self.label}: a p5 has 1-{P5.gpu_count} GPUs and 1-{P5.efa_count} EFA devices")
        # ENA-like interfaces beyond the first get the names a p5 gives its extra network cards.
        enas = tuple(f"ens{32 * (i + 1)}" for i in range(self.ena))
        return dataclasses.replace(
            P5, gpu_count=self.gpus, gpu_bus_ids=P5.gpu_bus_ids[: self.gpus],
            efa_devices=P5.efa_devices[: self.efa], ena_interfaces=enas,
        )


class SimTree:
    """One node's sysfs/procfs tree (and GPU/ENA state files), kept moving by :meth:`tick`.

    ``hard=True`` is the node of issue #16, the harder case for a scrape: a node
    up for weeks, whose 1,150 EFA counters in both counter directories all hold
    distinct, long values (the kernel-verbs error counters included), two counter
    files that cannot be read, a Mellanox RDMA device beside the EFA ones, and the
    container interfaces every Kubernetes node has.
    """

    UNREADABLE = (  # (device, directory below it, counter): a directory and a value that is no number
        ("rdmap79s0", "hw_counters", "create_ah_err"),
        ("rdmap80s0", "ports/1/hw_counters", "impaired_remote_conn_events"),
    )

    def __init__(self, shape: NodeShape, root: str, index: int = 0, hard: bool = False) -> None:
        from fleetscope_sim.node import Load, NodeModel
        from fleetscope_sim.tree import NodePaths, TreeWriter

        self.shape = shape
        self.hard = hard
        self.paths = NodePaths(root)
        self.model = NodeModel(f"bench-{shape.label}", index, shape.profile(), seed=7 + index)
        if hard:
            self._seed_weeks_of_traffic(index)
        self.writer = TreeWriter(self.model, self.paths)
        self.writer.setup()
        if hard:
            self._add_hard_parts()
        self.load = Load(gpu_busy=dict.fromkeys(range(shape.gpus), 0.92), network=0.85)
        self._elapsed = 0.0

    def _seed_weeks_of_traffic(self, index: int) -> None:
        """Distinct counter values, as on a node that has moved traffic for weeks (set before the first write)."""
        import random

        rng = random.Random(f"hard:{index}")
        seen: set[int] = set()

        def distinct(low: int, high: int) -> int:
            value = rng.randint(low, high)
            while value in seen:
                value += 1
            seen.add(value)
            return value

        for efa in self.model.efa:
            for name in efa.port:
                big = name.endswith("bytes")
                efa.port[name] = distinct(10**12, 9 * 10**12) if big else distinct(10**6, 9 * 10**9)
            for name in (*efa.device, "alloc_mr_err", "get_dma_mr_err"):  # kernel verbs: newer drivers
                efa.device[name] = distinct(1, 10**6)
        for nic in self.model.nics:
            for name in nic.stats:
                nic.stats[name] = distinct(10**5, 10**13)
        for table in (self.model.tcp, self.model.tcp_ext):
            for name in table:
                table[name] = distinct(10**3, 10**10)
        for device, directory, counter in self.UNREADABLE:  # the model never writes these: _add_hard_parts does
            efa = next(e for e in self.model.efa if e.name == device)
            (efa.device if directory == "hw_counters" else efa.port).pop(counter)

    def _add_hard_parts(self) -> None:
        from fleetscope_sim.kernel_tree import DIRECTORY

        sysfs = self.writer.sysfs
        ib = sysfs.path("class", "infiniband")
        for (device, directory, counter), bad in zip(self.UNREADABLE, (DIRECTORY, "N/A (no PMA)"), strict=True):
            where = os.path.relpath(os.path.realpath(os.path.join(ib, device)), sysfs.root)
            sysfs.remove(os.path.join(where, directory, counter))
            sysfs.write(os.path.join(where, directory, counter), bad)
        sysfs.rdma_device(
            "mlx5_0", "0000:e1:00.0",
            {"out_of_buffer": 31, "out_of_sequence": 7, "duplicate_request": 2, "rx_write_requests": 88812},
            None, vendor="0x15b3", device_id="0x101d", driver="mlx5_core", numa_node=1, fw_ver="22.39.1002",
            rate="200 Gb/sec (4X HDR)", link_layer="Ethernet", lifespan=10,
            extra_port_dirs={"counters": {"port_rcv_data": 912_733_184, "port_xmit_data": 803_112_960}},
        )
        for i, name in enumerate(("docker0", "veth3c1a9f2", "eni8c3a1f2b9d0")):
            sysfs.net_interface(name, {"rx_bytes": 10**8 + i, "tx_bytes": 2 * 10**8 + i},
                                operstate="down" if name == "docker0" else "up", mtu=9001,
                                address=f"02:42:5e:11:9a:{i:02x}")

    def efa_counters(self) -> int:
        """EFA counter files that hold a number (what a reader can export)."""
        return sum(len(efa.port) + len(efa.device) for efa in self.model.efa)

    def tick(self, dt: float) -> None:
        self._elapsed += dt
        self.model.tick(dt, self._elapsed, self.load, [])
        self.writer.update()

    def add_node_exporter_shim(self) -> None:
        """Files node_exporter 1.5's infiniband collector needs before it reads a device.

        procfs (as vendored in node_exporter 1.5) refuses a device without ``board_id``/``hca_type``
        and a port without a PMA ``counters/`` directory; EFA on current kernels has neither, so
        without these the collector reports nothing at all. fleetscope's sources ignore them.
        """
        sysfs = self.writer.sysfs
        ib = sysfs.path("class", "infiniband")
        for name in sorted(os.listdir(ib)):
            device = os.path.relpath(os.path.realpath(os.path.join(ib, name)), sysfs.root)
            sysfs.write(os.path.join(device, "board_id"), "EFA")
            sysfs.write(os.path.join(device, "hca_type"), "efa")
            for port in os.listdir(sysfs.path(device, "ports")):
                sysfs.mkdir(os.path.join(device, "ports", port, "counters"))


class TreeTicker:
    """Ticks a set of trees once a second on a background thread until stopped (or its deadline)."""

    def __init__(self, trees: Sequence[SimTree], period: float = 1.0, max_seconds: float = 3600.0) -> None:
        self.trees = list(trees)
        self.period = period
        self.max_seconds = max_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        last = time.monotonic()
        while not self._stop.wait(self.period) and time.monotonic() < deadline:
            now = time.monotonic()
            for tree in self.trees:
                with contextlib.suppress(OSError):  # a failed tree write is the simulator's problem
                    tree.tick(now - last)
            last = now


# -- processes under measurement -----------------------------------------------------------------


@dataclass(frozen=True)
class ProcSample:
    wall: float  # time.monotonic()
    cpu_seconds: float  # utime + stime
    rss_bytes: int
    hwm_bytes: int  # peak RSS so far (VmHWM)


def sample_process(pid: int) -> ProcSample:
    """CPU time and memory of a live process, from /proc/<pid>/stat and /proc/<pid>/status."""
    wall = time.monotonic()
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        stat = handle.read()
    # Fields after the parenthesised command name (which may itself contain spaces).
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)
    rss = hwm = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return ProcSample(wall, cpu, rss, hwm)


def cpu_share(start: ProcSample, end: ProcSample) -> float:
    """Share of one core used between two samples."""
    elapsed = end.wall - start.wall
    return (end.cpu_seconds - start.cpu_seconds) / elapsed if elapsed > 0 else math.nan


Server = Daemon | GoServer  # what the benchmarks start: the shared harness's processes (port 0, address read back)


class Services:
    """Starts servers together (all spawned, then each waited for), stops them all (by pid) however the block ends.

    Each binds port 0 and says what it bound (:mod:`fleetscope_sim.harness`): no port is probed, so none can be
    taken by another process between a probe and a bind."""

    def __init__(self) -> None:
        self.started: list[Server] = []

    def start(self, *servers: Server, ready_timeout: float = 240.0) -> None:
        for server in servers:
            server.spawn()
            self.started.append(server)
        for server in servers:
            server.wait_ready(ready_timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for server in reversed(self.started):
            server.stop(timeout=10)


def daemon_service(name: str, root: str, log_dir: str, collectors: Sequence[str], interval: str = "default",
                   pause_after: str = "") -> Daemon:
    """A fleetscope daemon over a simulated tree (see :mod:`benchmarks.nodeproc`), on port 0."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    for key in [k for k in env if k.startswith("FLEETSCOPE_")]:
        del env[key]  # the caller's shell must not change what is measured
    ready = Path(log_dir) / f"{name}.ready"
    argv = [sys.executable, "-m", "benchmarks.nodeproc", "--root", root, "--listen", f"{HOST}:0",
            "--ready-file", str(ready), "--collectors", ",".join(collectors), "--interval", interval]
    if pause_after:
        argv += ["--pause-after", pause_after]
    return Daemon(argv, Path(log_dir) / f"{name}.log", env=env, cwd=REPO_ROOT, ready_file=ready)


def node_exporter_service(binary: str, root: str, log_dir: str) -> GoServer:
    """node_exporter on port 0 (it logs the address it bound at its default level, info)."""
    argv = [binary, f"--web.listen-address={HOST}:0", f"--path.sysfs={root}/sys", f"--path.procfs={root}/proc",
            f"--path.rootfs={root}", "--collector.disable-defaults", "--collector.netdev", "--collector.netstat",
            "--collector.infiniband"]
    return GoServer(argv, Path(log_dir) / "node_exporter.log", ready_path="/")


def pushgateway_service(binary: str, log_dir: str) -> Pushgateway:
    return Pushgateway(log_dir, binary=binary)


def binary_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    import re

    match = re.search(r"version (\S+)", out.stdout or out.stderr)
    return match.group(1) if match else "unknown"


def find_binary(name: str, default: str) -> str | None:
    if os.path.exists(default):
        return default
    return shutil.which(name)


# -- HTTP ----------------------------------------------------------------------------------------


def http_get(port: int, path: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class KeepAliveClient:
    """One persistent HTTP/1.1 connection, reopened after an error (as Prometheus and pushers do)."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.port = port
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        for attempt in range(2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
            try:
                self._conn.request(method, path, body=body, headers=headers or {})
                response = self._conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def scrape_headers(accept: str = PROMETHEUS_ACCEPT, timeout: float = 10.0) -> dict[str, str]:
    """The headers of a Prometheus scrape request."""
    return {"Accept": accept, "Accept-Encoding": "gzip", "User-Agent": "Prometheus/2.42.0",
            "X-Prometheus-Scrape-Timeout-Seconds": f"{timeout:g}"}


def metrics_text(port: int, path: str = "/metrics") -> str:
    """One scrape in the classic text format (uncompressed), for parsing."""
    status, body = http_get(port, path, headers={"Accept": "text/plain;version=0.0.4"})
    if status != 200:
        raise RuntimeError(f"GET {path} on :{port} answered {status}")
    return body.decode("utf-8")


def concurrent_scrapes(port: int, clients: int, per_client: int, max_seconds: float, path: str = "/metrics",
                       headers: dict[str, str] | None = None) -> tuple[list[float], int]:
    """``clients`` threads each scraping back to back; returns (latencies in seconds, errors)."""
    headers = headers or scrape_headers()
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + max_seconds

    def worker() -> None:
        client = KeepAliveClient(port)
        mine: list[float] = []
        try:
            for _ in range(per_client):
                if time.monotonic() > deadline:
                    break
                t0 = time.perf_counter()
                try:
                    status, _ = client.request("GET", path, headers=headers)
                except OSError:
                    status = 0
                elapsed = time.perf_counter() - t0
                if status == 200:
                    mine.append(elapsed)
                else:
                    with lock:
                        errors[0] += 1
        finally:
            client.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=worker, name=f"scraper-{i}") for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max_seconds + 30)
    return latencies, errors[0]


@dataclass
class PacedScraper:
    """Scrapes one target every ``interval`` seconds on a thread (a Prometheus stand-in).

    Prometheus's own request: its Accept and Accept-Encoding headers on a kept-alive
    connection, unless ``headers`` (or ``on_body``, which wants the text format) says
    otherwise. ``delay`` offsets the first scrape, as Prometheus spreads its targets.
    """

    port: int
    interval: float
    path: str = "/metrics"
    on_body: Callable[[bytes], None] | None = None
    headers: dict[str, str] | None = None
    delay: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, max_scrapes: int = 100_000) -> None:
        self._thread = threading.Thread(target=self._run, args=(max_scrapes,), name=f"scrape-{self.port}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self, max_scrapes: int) -> None:
        client = KeepAliveClient(self.port)
        headers = self.headers or (scrape_headers() if self.on_body is None else {"Accept": "text/plain;version=0.0.4"})
        if self._stop.wait(self.delay):
            return
        next_at = time.monotonic()
        try:
            for _ in range(max_scrapes):
                if self._stop.is_set():
                    break
                t0 = time.perf_counter()
                try:
                    status, body = client.request("GET", self.path, headers=headers)
                except OSError:
                    status, body = 0, b""
                if status == 200:
                    self.latencies.append(time.perf_counter() - t0)
                    if self.on_body is not None:
                        self.on_body(body)
                else:
                    self.errors += 1
                next_at += self.interval
                if self._stop.wait(max(0.0, next_at - time.monotonic())):
                    break
        finally:
            client.close()


# -- push workloads ------------------------------------------------------------------------------


def step_record(job: str, rank: int, step: int, world_size: int) -> dict[str, Any]:
    """A record like the one :class:`fleetscope.client.StepTracker` sends for a timed step."""
    return {
        "job": job, "rank": rank, "local_rank": rank % 8, "world_size": world_size, "gpu": rank % 8,
        "step": step, "step_seconds": 1.0 + 0.001 * (step % 7), "timestamp": time.time(),
        "data_seconds": 0.02, "compute_seconds": 0.78, "comm_seconds": 0.2,
        "tokens": 32768, "samples": 8, "loss": 2.5 - 0.0001 * step,
    }


def gateway_body(record: dict[str, Any]) -> bytes:
    """The same step as a Pushgateway group in text format (what a PushGateway-based job pushes)."""
    lines = []
    for key, kind in (("step", "gauge"), ("step_seconds", "gauge"), ("data_seconds", "gauge"),
                      ("compute_seconds", "gauge"), ("comm_seconds", "gauge"), ("tokens", "gauge"),
                      ("samples", "gauge"), ("loss", "gauge"), ("timestamp", "gauge")):
        name = f"training_{key}"
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name} {record[key]}")
    return ("\n".join(lines) + "\n").encode("ascii")


@dataclass(frozen=True)
class PushOutcome:
    records: int
    requests: int
    errors: int
    seconds: float
    busy: int = 0  # 503 answers (push.max-inflight-bytes reached), retried after Retry-After as the client does

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else math.nan

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else math.nan


def push_load(port: int, ranks: int, mode: str, batch: int, max_requests_per_rank: int, max_seconds: float,
              job: str = "bench") -> PushOutcome:
    """``ranks`` threads pushing step records as fast as the server takes them.

    Modes: ``post`` (JSON to /api/v1/steps, ``batch`` records per request), ``put`` (each record as
    a PUT of the rank's Pushgateway group ``/metrics/job/<job>/rank/<rank>`` in text format).
    """
    if mode not in ("post", "put"):
        raise ValueError(mode)
    counts = [0, 0, 0, 0]  # records, requests, errors, busy
    lock = threading.Lock()
    start_gate = threading.Barrier(ranks + 1)
    deadline_box: list[float] = [0.0]

    def worker(rank: int) -> None:
        client = KeepAliveClient(port)
        step = 0
        records = requests = errors = busy = 0
        start_gate.wait()
        try:
            for _ in range(max_requests_per_rank):
                if time.monotonic() > deadline_box[0]:
                    break
                if mode == "post":
                    batch_records = [step_record(job, rank, step + i + 1, ranks) for i in range(batch)]
                    body = json.dumps(batch_records if batch > 1 else batch_records[0]).encode()
                    path, method, headers = "/api/v1/steps", "POST", {"Content-Type": "application/json"}
                    sent = batch
                else:
                    body = gateway_body(step_record(job, rank, step + 1, ranks))
                    path, method = f"/metrics/job/{job}/rank/{rank}", "PUT"
                    headers = {"Content-Type": "text/plain; version=0.0.4"}
                    sent = 1
                while True:
                    try:
                        status, _ = client.request(method, path, body=body, headers=headers)
                    except OSError:
                        status = 0
                    if status != 503 or time.monotonic() > deadline_box[0]:
                        break
                    busy += 1
                    time.sleep(1.0)  # the daemon's Retry-After
                requests += 1
                if 200 <= status < 300:
                    records += sent
                    step += sent
                else:
                    errors += 1
        finally:
            client.close()
            with lock:
                counts[0] += records
                counts[1] += requests
                counts[2] += errors
                counts[3] += busy

    threads = [threading.Thread(target=worker, args=(r,), name=f"pusher-{r}") for r in range(ranks)]
    for thread in threads:
        thread.start()
    deadline_box[0] = time.monotonic() + max_seconds
    t0 = time.perf_counter()
    start_gate.wait()
    for thread in threads:
        thread.join(timeout=max_seconds + 30)
    elapsed = time.perf_counter() - t0
    return PushOutcome(counts[0], counts[1], counts[2], elapsed, counts[3])


class RankFleet:
    """``ranks`` real :class:`fleetscope.client.StepTracker` instances reporting steps at ``steps_per_second``.

    One driver thread plays every rank's training loop (calling ``report``); each tracker's own
    sender thread batches and posts, exactly as in a training job.
    """

    def __init__(self, port: int, ranks: int, steps_per_second: float, job: str = "bench") -> None:
        from fleetscope.client import StepTracker

        url = f"http://{HOST}:{port}"
        self.trackers = [
            StepTracker(job=job, rank=r, local_rank=r % 8, world_size=ranks, gpu=r % 8, url=url, environ={})
            for r in range(ranks)
        ]
        self.period = 1.0 / steps_per_second
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-fleet", daemon=True)
        self.steps = 0

    def start(self) -> None:
        self._thread.start()

    def _run(self, max_steps: int = 1_000_000) -> None:
        for _ in range(max_steps):
            if self._stop.wait(self.period):
                break
            for tracker in self.trackers:
                tracker.report(self.period, data_seconds=0.02 * self.period, compute_seconds=0.78 * self.period,
                               comm_seconds=0.2 * self.period, tokens=32768, samples=8, loss=2.5)
            self.steps += 1

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join(timeout=10)
        totals = {"enqueued": 0, "sent": 0, "dropped": 0, "rejected": 0, "failures": 0}
        for tracker in self.trackers:
            tracker.close(timeout=2.0)
            stats = tracker.stats()
            for key in totals:
                totals[key] += getattr(stats, key)
        return totals
