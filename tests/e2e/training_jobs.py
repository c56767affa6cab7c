"""Real training jobs on simulated nodes, watched by a real Prometheus with the compressed rules.

Each node is a real ``fleetscope serve`` process with only the steps collector
(this machine has no EFA or GPU to read), reading the real ``/proc``, so it
can tell a rank's process is gone. Ranks are real ``torch.distributed`` (gloo)
processes (:mod:`tests.e2e.gloo_rank`, forked from one that imported torch once:
:mod:`tests.rank_server`) placed on the nodes in order, pushing
to their own node's daemon. Prometheus scrapes every node, labelled
``instance=node-NN`` as a real node's hostname would be.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from fleetscope_sim.detection import AlertWatcher
from fleetscope_sim.harness import Daemon, Prometheus
from tests import rank_server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "alerts", "fleetscope.e2e.rules.yml")
PRODUCTION_RULES = os.path.join(ROOT, "alerts", "fleetscope.rules.yml")
SCRAPE_SECONDS = 5.0  # the compressed rules' scrape interval; the shipped configs scrape every 15 s
# The GPUs each node's ranks see, as a scheduler would set them: node-01's ranks get the node's GPUs
# 4-7, so local rank 2 computes on GPU 6 (the client maps the CUDA ordinal back).
VISIBLE_DEVICES = {"node-01": "4,5,6,7"}


@dataclass
class Cluster:
    workdir: str
    nodes: int
    rules: str = RULES
    scrape_seconds: float = SCRAPE_SECONDS
    daemons: list[Daemon] = field(default_factory=list)
    ranks: dict[str, Sequence[rank_server.Rank | subprocess.Popen[bytes]]] = field(default_factory=dict)
    prometheus: Prometheus | None = None
    watcher: AlertWatcher | None = None

    def node(self, index: int) -> str:
        return f"node-{index:02d}"

    def url(self, index: int) -> str:
        return self.daemons[index].url

    def start(self, median_window: int = 64) -> None:
        settings = {"collector.efa": False, "collector.netdev": False, "collector.netstat": False,
                    "collector.ena": False, "collector.gpu": False, "collector.steps": True,
                    "push.median-window": median_window}
        self.daemons = [Daemon.serve(self.workdir, settings, name=self.node(i), env=_environ())
                        for i in range(self.nodes)]
        for daemon in self.daemons:
            daemon.spawn()
        # Prometheus starts once every daemon answers, as on a cluster where the DaemonSet runs before jobs
        # do: scraped while still importing, a daemon is down (`up == 0`), and FleetscopeDown fires after 30 s.
        for daemon in self.daemons:
            daemon.wait_ready()
        interval = f"{self.scrape_seconds:g}s"
        timeout = f"{min(self.scrape_seconds, 10):g}s"
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": timeout},
            "rule_files": [self.rules],
            "scrape_configs": [{
                "job_name": "fleetscope",
                "static_configs": [
                    {"targets": [daemon.address], "labels": {"instance": self.node(i)}}
                    for i, daemon in enumerate(self.daemons)
                ],
            }],
        }
        self.prometheus = Prometheus(os.path.join(self.workdir, "prometheus"))
        self.prometheus.start(config)
        self.watcher = AlertWatcher(self.prometheus.alerts)
        self.watcher.start()

    def launch(self, job: str, ranks: int, per_node: int, master_port: int, *args: str, first_node: int = 0) -> None:
        """``ranks`` ranks of ``job``, ``per_node`` on each node in order from ``first_node``; ``args`` go to
        gloo_rank."""
        procs: list[rank_server.Rank | subprocess.Popen[bytes]] = []
        for rank in range(ranks):
            index = first_node + rank // per_node
            env = _environ()
            env.update({
                "RANK": str(rank), "LOCAL_RANK": str(rank % per_node), "WORLD_SIZE": str(ranks),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
                "FLEETSCOPE_PUSH_URL": self.url(index), "FLEETSCOPE_JOB": job, "OMP_NUM_THREADS": "1",
            })
            if self.node(index) in VISIBLE_DEVICES:
                env["CUDA_VISIBLE_DEVICES"] = VISIBLE_DEVICES[self.node(index)]
            procs.append(rank_server.launch(["-m", "tests.e2e.gloo_rank", *args], env, ROOT, self.log(job, rank)))
        self.ranks[job] = procs

    def launch_torchrun(self, job: str, ranks: int, node: int, max_restarts: int, *args: str) -> None:
        """``ranks`` ranks of ``job`` on one node under ``torchrun --max-restarts`` (elastic restarts)."""
        env = _environ()
        env.update({"FLEETSCOPE_PUSH_URL": self.url(node), "FLEETSCOPE_JOB": job, "OMP_NUM_THREADS": "1"})
        with open(self.log(job, 0), "wb") as log:
            self.ranks[job] = [subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                 f"--max-restarts={max_restarts}", "--monitor-interval=1", "-m", "tests.e2e.gloo_rank", *args],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )]

    def log(self, job: str, rank: int) -> str:
        return os.path.join(self.workdir, f"{job}-rank{rank}.log")

    def fault_time(self, job: str, rank: int) -> float | None:
        """When the faulted rank said its fault happened (``fault <unix time>`` in its log)."""
        with open(self.log(job, rank), encoding="utf-8", errors="replace") as log:
            found = re.findall(r"^fault (\d+\.\d+)$", log.read(), re.MULTILINE)
        return float(found[0]) if found else None

    def codes(self, job: str) -> list[int | None]:
        """Each rank's exit code, None while it runs."""
        return [proc.poll() for proc in self.ranks[job]]

    def wait(self, job: str, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout
        for proc in self.ranks[job]:
            with suppress(subprocess.TimeoutExpired):  # still running: its code stays None
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        return [proc.poll() for proc in self.ranks[job]]

    def fired(self) -> list[dict[str, str]]:
        assert self.watcher is not None
        self.watcher.poll()
        return [s.labels for s in self.watcher.sightings.values()]

    def first_fired(self, alertname: str, **labels: str) -> float | None:
        assert self.watcher is not None
        times = [
            s.first_firing for s in self.watcher.sightings.values()
            if s.labels.get("alertname") == alertname and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        return min(times) if times else None

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        for procs in self.ranks.values():
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)  # the rank and its DataLoader workers
                    proc.wait(10)
        for daemon in self.daemons:
            daemon.stop()
        if self.prometheus is not None:
            self.prometheus.stop()


def _environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSCOPE_", "CUDA_", "SLURM_", "NVIDIA_"))}
    paths = [os.path.join(ROOT, "exporter"), ROOT, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


@contextmanager
def cluster(nodes: int, median_window: int = 64, rules: str = RULES,
            scrape_seconds: float = SCRAPE_SECONDS) -> Iterator[Cluster]:
    """Nodes, Prometheus and an alert watcher; on failure the work directory (rank logs) is kept."""
    running = Cluster(tempfile.mkdtemp(prefix="fleetscope-jobs-"), nodes, rules, scrape_seconds)
    try:
        running.start(median_window)
        yield running
    finally:
        running.stop()
    shutil.rmtree(running.workdir, ignore_errors=True)


def alert_keys(fired: Sequence[dict[str, str]], *names: str) -> set[tuple[str, ...]]:
    """(alertname, training_job, rank) of each sighting, for the named alerts (all when none named)."""
    return {
        (a["alertname"], a.get("training_job", ""), a.get("rank", ""))
        for a in fired if not names or a["alertname"] in names
    }
