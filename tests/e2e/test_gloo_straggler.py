"""Real training, real detection: a 4-rank torch.distributed (gloo, CPU) job over 2 simulated nodes.

Two such jobs run at once and push through fleetscope.client to the nodes'
daemons, scraped by a real Prometheus with the compressed rules: in one job
rank 2 computes 20% slower, the other is healthy. The straggler alert must
name rank 2 of the first job and nothing else may fire.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from fleetscope.sim.cluster import SimCluster, make_cluster
from fleetscope.sim.detection import AlertWatcher
from fleetscope.sim.prom import Prometheus, prometheus_config
from fleetscope.sim.tree import make_workdir

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "alerts", "fleetscope.e2e.rules.yml")
TRAIN_SECONDS = 130.0
SLOW_RANK = 2


def _launch_job(job: str, cluster: SimCluster, master_port: int, slow_rank: int, logdir: str) -> list[subprocess.Popen]:
    """Ranks 0-1 on node-00 and 2-3 on node-01, each pushing to its own node's daemon."""
    procs = []
    for rank in range(4):
        node = f"node-{rank // 2:02d}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSCOPE_", "CUDA_", "SLURM_"))}
        env.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank % 2), "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port), "FLEETSCOPE_PUSH_URL": cluster.url(node), "FLEETSCOPE_JOB": job,
            "OMP_NUM_THREADS": "1",
        })
        with open(os.path.join(logdir, f"{job}-rank{rank}.log"), "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "fleetscope.sim.gloo_job", "--seconds", str(TRAIN_SECONDS),
                 "--slow-rank", str(slow_rank), "--slowdown", "0.2"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            ))
    return procs


def test_straggler_alert_names_the_slow_rank_only(prometheus_binary: str, port_run: Callable[[int], int]) -> None:
    base = port_run(5)
    # CPU ranks sharing two cores are noisier per step than GPUs; these ranks step ~10 times a second, so a
    # 128-step rolling median still covers about 13 s and smooths the scheduler's noise away.
    spec = make_cluster(nodes=2, jobs=0, base_port=base, profiles=("p4d.24xlarge",),
                        daemon_settings=(("push.median-window", "128"),))
    workdir = make_workdir("fleetscope-gloo-")
    cluster = SimCluster(spec, os.path.join(workdir, "nodes"))
    prometheus = Prometheus(os.path.join(workdir, "prometheus"), listen=f"127.0.0.1:{base + 2}")
    watcher = AlertWatcher(prometheus.alerts)
    procs: list[subprocess.Popen] = []
    try:
        cluster.start()
        prometheus.start(prometheus_config(spec, [RULES], scrape_interval=5.0))
        watcher.start()
        cluster.run_in_thread()
        procs += _launch_job("gloo-slow", cluster, base + 3, SLOW_RANK, workdir)
        procs += _launch_job("gloo-even", cluster, base + 4, -1, workdir)
        deadline = time.monotonic() + TRAIN_SECONDS + 90
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        watcher.stop()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        cluster.stop()
        prometheus.stop()
    assert [p.returncode for p in procs] == [0] * 8, f"a rank failed; logs in {workdir}"
    fired = [s.labels for s in watcher.sightings.values()]
    stragglers = [a for a in fired if a["alertname"] == "TrainingStragglerRank"]
    assert stragglers, f"no straggler alert; alerts seen: {fired}"
    assert {(a["training_job"], a["rank"]) for a in stragglers} == {("gloo-slow", str(SLOW_RANK))}
    assert {a["instance"] for a in stragglers} == {"node-01"}
    others = [a for a in fired if a["alertname"] != "TrainingStragglerRank"]
    assert others == []
    shutil.rmtree(workdir, ignore_errors=True)  # kept when an assertion fails: the rank logs are there
