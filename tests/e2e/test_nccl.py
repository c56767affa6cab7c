"""Live: NCCL Inspector plugin-format output -> two real daemons -> a real Prometheus -> the e2e rules.

Two 8-rank data-parallel jobs train on two nodes (4 ranks each) at once and
write the Inspector's JSON lines as they go, modelled as synchronous
collectives (sim/inspector.py): in ``nccl-late``, a Slurm-style job, rank 5
computes 12% slower, so it arrives last and waits least; ``nccl-even`` runs
its ranks in pods (pid 1 in every container, beside the host's own pid 1)
and is healthy. Each node's daemon reads its node's output directory and
attributes every file through the node's procfs. NcclLateRank must name
rank 5 of nccl-late on node-b, and only it; every rank of both jobs is scored.
How soon it fires, and that a healthy job stays silent for good, are promtool's
(tests/alerts/nccl.test.yml): this run asks for the verdict, with a generous limit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time

import pytest

from fleetscope_sim.detection import AlertWatcher
from fleetscope_sim.harness import Daemon, Prometheus, eventually
from fleetscope_sim.inspector import CollectiveSpec, InspectorJob, InspectorNode
from fleetscope_sim.tree import make_workdir
from tests.conftest import require_binary

pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "alerts", "fleetscope.e2e.rules.yml")
NODES = ("node-a", "node-b")
LATE_RANK = 5
LIMIT = 360.0  # generous: the compressed windows (1m rate, 1m for) name it in about two minutes
MiB = 1 << 20
# A DDP step: four 25 MiB gradient buckets as backward fills them, and a small all-reduce (loss, grad norm).
DDP = (CollectiveSpec("AllReduce", 25 * MiB, 4, 150e9), CollectiveSpec("AllReduce", 64 * 1024, 1, 5e9))


def test_the_rank_that_arrives_last_is_named_and_every_rank_is_scored() -> None:
    require_binary("prometheus")
    workdir = make_workdir("fleetscope-nccl-")
    nodes = {}
    for name in NODES:
        root = os.path.join(workdir, name)
        node = InspectorNode(os.path.join(root, "dump"), os.path.join(root, "proc"), hostname=name)
        os.makedirs(os.path.join(root, "proc", "1"), exist_ok=True)
        os.makedirs(os.path.join(root, "sys"), exist_ok=True)
        with open(os.path.join(root, "proc", "1", "status"), "w", encoding="utf-8") as handle:
            handle.write("Name:\tsystemd\nNSpid:\t1\n")  # the host's init: also pid 1, like every pod's rank
        nodes[name] = node
    node_list = [nodes[n] for n in NODES]
    now = time.time()
    late = InspectorJob("nccl-late", node_list, 4, DDP, slow={LATE_RANK: 1.12}, seed=11)
    even = InspectorJob("nccl-even", node_list, 4, DDP, pods=True, seed=23)
    late.start(now, first_pid=41_000)
    even.start(now, first_pid=52_000)

    daemons = [Daemon.serve(os.path.join(workdir, name), {
        "path.sysfs": f"{workdir}/{name}/sys", "path.procfs": f"{workdir}/{name}/proc",
        "nccl.dir": f"{workdir}/{name}/dump", "collector.nccl.interval": "2s", "collector.gpu": False,
        "collector.efa": False, "collector.ena": False, "collector.netdev": False, "collector.netstat": False,
        "collector.steps": False}) for name in NODES]
    prometheus = Prometheus(os.path.join(workdir, "prometheus"))
    watcher = AlertWatcher(prometheus.alerts)
    stop = threading.Event()

    def train() -> None:
        while not stop.wait(1.0):  # one dump a second, NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=1000000
            for job in (late, even):
                job.advance(time.time())

    def named() -> list[dict[str, str]]:
        watcher.poll()
        return [s.labels for s in watcher.sightings.values() if s.labels["alertname"] == "NcclLateRank"]

    trainer = threading.Thread(target=train, name="nccl-jobs", daemon=True)
    try:
        for daemon in daemons:
            daemon.start()
        prometheus.start({
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s", "scrape_timeout": "5s"},
            "rule_files": [RULES],
            "scrape_configs": [{"job_name": "fleetscope", "static_configs": [
                {"targets": [daemon.address], "labels": {"instance": name}}
                for name, daemon in zip(NODES, daemons, strict=True)
            ]}],
        })
        trainer.start()
        with contextlib.suppress(TimeoutError):  # the assertions below say what fired instead
            eventually(named, LIMIT, "NcclLateRank to fire", interval=2.0)
        late_ranks = prometheus.query('rank:fleetscope_nccl_collective_seconds:max_ratio_comm_median')
    finally:
        stop.set()
        for daemon in daemons:
            daemon.stop()
        prometheus.stop()
    fired_labels = [s.labels for s in watcher.sightings.values()]
    assert named(), f"NcclLateRank never fired; alerts: {fired_labels}; logs in {workdir}"
    assert {(a["training_job"], a["rank"], a["instance"]) for a in named()} == {("nccl-late", str(LATE_RANK), "node-b")}
    assert not [a for a in fired_labels if a.get("training_job") == "nccl-even"], fired_labels
    # Every rank of both jobs was attributed (Slurm-style host processes and pods alike) and scored.
    scored = {(r["metric"]["training_job"], r["metric"]["rank"]) for r in late_ranks}
    assert scored == {(job, str(rank)) for job in ("nccl-late", "nccl-even") for rank in range(8)}
    shutil.rmtree(workdir, ignore_errors=True)  # kept when an assertion fails: daemon logs are there
