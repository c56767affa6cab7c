"""Run a worker script as a small torchrun job (gloo, CPU) pushing to a test daemon."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from tests import rank_server
from tests.conftest import ROOT
from tests.push.live import LiveDaemon

TIMEOUT = 300.0


def torchrun(worker: Path, daemon: LiveDaemon, job: str, *args: str, ranks: int = 2, elastic_agent: bool = False,
             **env_vars: str) -> None:
    """``ranks`` processes of ``worker``, pushing to ``daemon`` as ``job``; fails on a bad exit.

    With ``elastic_agent`` under ``torch.distributed.run --standalone`` itself; otherwise this process plays
    torchrun's agent: it hosts the rendezvous store and starts the ranks with the environment the agent gives
    its workers (torch/distributed/elastic/agent/server/local_elastic_agent.py), which is all a rank, the
    client and the frameworks read. That spares each job the agent's own interpreter (a torch import, about
    4 s of CPU on the suite's machine)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSCOPE_", "SLURM_", "CUDA_", "TORCHELASTIC_"))}
    env.update({
        "FLEETSCOPE_PUSH_URL": daemon.url, "FLEETSCOPE_JOB": job, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (os.path.join(ROOT, "exporter"), ROOT, env.get("PYTHONPATH")) if p),
        **env_vars,
    })
    if elastic_agent:
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
             str(worker), *args],
            env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, world_size=ranks, is_master=True, wait_for_workers=False)
    shared = {
        "GROUP_RANK": "0", "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(ranks), "WORLD_SIZE": str(ranks),
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": str(uuid.uuid4()), "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    with tempfile.TemporaryDirectory(prefix="ranks-") as logs:
        processes = []
        for rank in range(ranks):
            rank_env = {**env, **shared, "RANK": str(rank), "ROLE_RANK": str(rank), "LOCAL_RANK": str(rank)}
            processes.append(rank_server.launch([str(worker), *args], rank_env, os.getcwd(),
                                                os.path.join(logs, f"{rank}.log")))
        failed = _supervise(processes)
        del store  # the ranks are gone: the store's server goes with the object
        if failed is not None:
            output = Path(logs, f"{processes.index(failed)}.log").read_text(errors="replace")
            raise AssertionError(f"rank {processes.index(failed)} exited {failed.returncode}:\n{output[-6000:]}")


def _supervise(processes: list[rank_server.Rank]) -> rank_server.Rank | None:
    """Wait for every rank; as torchrun does, the first to fail (or the deadline) ends the others.
    The failed rank, or None when all exited 0."""
    exited: queue.Queue[rank_server.Rank] = queue.Queue()

    def wait(process: rank_server.Rank) -> None:
        process.wait()
        exited.put(process)

    for process in processes:
        threading.Thread(target=wait, args=(process,), daemon=True).start()
    deadline = time.monotonic() + TIMEOUT
    failed = None
    try:
        for _ in processes:
            try:
                process = exited.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"ranks still running after {TIMEOUT:g} s") from None
            if process.returncode != 0:
                failed = process
                break
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    return failed


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
