"""Run a worker script as a small torchrun job (gloo, CPU) pushing to a test daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.push.live import LiveDaemon


def torchrun(worker: Path, daemon: LiveDaemon, job: str, *args: str, ranks: int = 2, **env_vars: str) -> None:
    """``ranks`` processes of ``worker`` under torchrun, pushing to ``daemon`` as ``job``; fails on a bad exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSCOPE_", "SLURM_", "CUDA_"))}
    env.update({
        "FLEETSCOPE_PUSH_URL": daemon.url, "FLEETSCOPE_JOB": job, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (os.path.join(ROOT, "exporter"), ROOT, env.get("PYTHONPATH")) if p),
        **env_vars,
    })
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), str(worker),
         *args],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def assert_rank_1_is_the_slow_one(daemon: LiveDaemon, steps: int, slower_by: float) -> None:
    """Rank 1 computes ``slower_by`` seconds longer per step (a sleep in its model's step): booked as its compute,
    and rank 0 spent time in its collectives, booked as comm.

    Only what the sleep guarantees, whatever the machine's load: it lasts at least ``slower_by`` and lies outside
    every collective. How much of it rank 0 waits (its comm against rank 1's) is a race between processes on a
    loaded machine; the peer's wait booked as comm is proven by construction in test_device_phases.py (a device
    that reaches the all-reduce a set time after its peer, events not timings) and the straggler's verdict from
    these medians by promtool over recorded DDP series (tests/alerts)."""
    views = {view.rank: view.values for view in daemon.collector.store.view().ranks}
    assert sorted(views) == [0, 1] and views[0]["steps"] == views[1]["steps"] == steps
    assert views[1]["compute_seconds_median"] >= slower_by, views
    assert views[0]["comm_seconds_median"] > 0, views
