"""NCCL Inspector end to end: plugin-format output -> two real daemons -> a real Prometheus -> the e2e rules.

Two 8-rank data-parallel jobs train on two nodes (4 ranks each) at once and
write the Inspector's JSON lines as they go, modelled as synchronous
collectives (sim/inspector.py): in ``nccl-late``, a Slurm-style job, rank 5
computes 12% slower, so it arrives last and waits least; ``nccl-even`` runs
its ranks in pods (pid 1 in every container, beside the host's own pid 1)
and is healthy. Each node's daemon reads its node's output directory and
attributes every file through the node's procfs. NcclLateRank must name
rank 5 of nccl-late on node-b, and nothing else may fire.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from fleetscope_sim.detection import AlertWatcher
from fleetscope_sim.inspector import CollectiveSpec, InspectorJob, InspectorNode
from fleetscope_sim.prom import Prometheus
from fleetscope_sim.tree import make_workdir

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "alerts", "fleetscope.e2e.rules.yml")
NODES = ("node-a", "node-b")
LATE_RANK = 5
MIN_SECONDS = 170.0  # the healthy job must stay silent at least this long: rate window 1m + for 1m + margin
LIMIT = 240.0  # the late rank must be named within this (compressed windows: 1m rate, 1m for)
MiB = 1 << 20
# A DDP step: four 25 MiB gradient buckets as backward fills them, and a small all-reduce (loss, grad norm).
DDP = (CollectiveSpec("AllReduce", 25 * MiB, 4, 150e9), CollectiveSpec("AllReduce", 64 * 1024, 1, 5e9))


def _daemon(root: str, port: int) -> subprocess.Popen[bytes]:
    os.makedirs(os.path.join(root, "sys"), exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    log = open(os.path.join(root, "daemon.log"), "wb")  # noqa: SIM115 - the process owns it until it exits
    return subprocess.Popen(
        [sys.executable, "-m", "fleetscope", "serve", f"--web.listen-address=127.0.0.1:{port}",
         f"--path.sysfs={root}/sys", f"--path.procfs={root}/proc", f"--nccl.dir={root}/dump",
         "--collector.nccl.interval=2s", "--no-collector.gpu", "--no-collector.efa", "--no-collector.ena",
         "--no-collector.netdev", "--no-collector.netstat", "--no-collector.steps"],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "daemon exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"daemon on {port} not ready")


def test_the_rank_that_arrives_last_is_named_and_a_healthy_job_is_silent(
    prometheus_binary: str, port_run: Callable[[int], int],
) -> None:
    base = port_run(3)
    workdir = make_workdir("fleetscope-nccl-")
    nodes = {}
    for name in NODES:
        root = os.path.join(workdir, name)
        node = InspectorNode(os.path.join(root, "dump"), os.path.join(root, "proc"), hostname=name)
        os.makedirs(os.path.join(root, "proc", "1"), exist_ok=True)
        with open(os.path.join(root, "proc", "1", "status"), "w", encoding="utf-8") as handle:
            handle.write("Name:\tsystemd\nNSpid:\t1\n")  # the host's init: also pid 1, like every pod's rank
        nodes[name] = node
    node_list = [nodes[n] for n in NODES]
    now = time.time()
    late = InspectorJob("nccl-late", node_list, 4, DDP, slow={LATE_RANK: 1.12}, seed=11)
    even = InspectorJob("nccl-even", node_list, 4, DDP, pods=True, seed=23)
    late.start(now, first_pid=41_000)
    even.start(now, first_pid=52_000)

    daemons = [_daemon(os.path.join(workdir, name), base + i) for i, name in enumerate(NODES)]
    prometheus = Prometheus(os.path.join(workdir, "prometheus"), listen=f"127.0.0.1:{base + 2}")
    watcher = AlertWatcher(prometheus.alerts)
    stop = threading.Event()

    def train() -> None:
        while not stop.wait(1.0):  # one dump a second, NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=1000000
            for job in (late, even):
                job.advance(time.time())

    trainer = threading.Thread(target=train, name="nccl-jobs", daemon=True)
    started = time.time()
    try:
        for i, proc in enumerate(daemons):
            _wait_ready(base + i, proc)
        prometheus.start({
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s", "scrape_timeout": "5s"},
            "rule_files": [RULES],
            "scrape_configs": [{"job_name": "fleetscope", "static_configs": [
                {"targets": [f"127.0.0.1:{base + i}"], "labels": {"instance": name}} for i, name in enumerate(NODES)
            ]}],
        })
        trainer.start()
        watcher.start()
        named_at = None
        while time.time() - started < LIMIT:
            time.sleep(2.0)
            fired = [s for s in watcher.sightings.values() if s.labels["alertname"] == "NcclLateRank"]
            if fired and named_at is None:
                named_at = min(s.first_firing for s in fired)
            if named_at is not None and time.time() - started >= MIN_SECONDS:
                break
        watcher.stop()
        late_ranks = prometheus.query('rank:fleetscope_nccl_collective_seconds:max_ratio_comm_median')
    finally:
        stop.set()
        for proc in daemons:
            proc.terminate()
        for proc in daemons:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        prometheus.stop()
    fired_labels = [s.labels for s in watcher.sightings.values()]
    assert named_at is not None, f"NcclLateRank never fired; alerts: {fired_labels}; logs in {workdir}"
    named = {(a["training_job"], a["rank"], a["instance"]) for a in fired_labels if a["alertname"] == "NcclLateRank"}
    assert named == {("nccl-late", str(LATE_RANK), "node-b")}
    assert [a for a in fired_labels if a["alertname"] != "NcclLateRank"] == []
    # Every rank of both jobs was attributed (Slurm-style host processes and pods alike) and scored.
    scored = {(r["metric"]["training_job"], r["metric"]["rank"]) for r in late_ranks}
    assert scored == {(job, str(rank)) for job in ("nccl-late", "nccl-even") for rank in range(8)}
    detect = named_at - started
    print(f"NcclLateRank named rank {LATE_RANK} {detect:.0f}s after the job started")
    assert detect <= LIMIT
    shutil.rmtree(workdir, ignore_errors=True)  # kept when an assertion fails: daemon logs are there
