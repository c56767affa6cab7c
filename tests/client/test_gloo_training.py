"""A real 2-process torch.distributed (gloo, CPU) training run pushes through a real daemon."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from tests.push.live import running_daemon

STEPS = 30
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gloo_worker.py")


@pytest.mark.slow
def test_two_rank_gloo_training_shows_per_rank_series() -> None:
    with running_daemon() as daemon:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSCOPE_", "SLURM_"))}
        env.update(
            {
                "FLEETSCOPE_PUSH_URL": daemon.url,
                "FLEETSCOPE_JOB": "gloo-ddp",
                "GLOO_TEST_STEPS": str(STEPS),
                "GLOO_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": "1",
            }
        )
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", WORKER],
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

        def value(name: str, rank: int) -> float | None:
            return daemon.value(name, training_job="gloo-ddp", rank=str(rank), local_rank=str(rank))

        for rank in (0, 1):
            assert value("fleetscope_training_steps_total", rank) == STEPS
            assert value("fleetscope_training_last_step", rank) == STEPS
            assert value("fleetscope_training_samples_total", rank) == STEPS * 16
            step_total = value("fleetscope_training_step_seconds_total", rank)
            parts = sum(
                value(f"fleetscope_training_{p}_seconds_total", rank) or 0
                for p in ("data", "compute", "comm")
            )
            assert step_total is not None and parts == pytest.approx(step_total)
            info = daemon.value(
                "fleetscope_training_rank_info", training_job="gloo-ddp", rank=str(rank), world_size="2",
                gpu=str(rank),  # torchrun, every GPU visible: cuda:LOCAL_RANK
            )
            assert info == 1
            assert daemon.value("fleetscope_training_phase", training_job="gloo-ddp", rank=str(rank),
                                phase="ended") == 1
        # Rank 1's accelerator takes 20 ms longer per step; synchronous training turns that into
        # rank 0's collective wait, which watch() books as comm.
        compute = [value("fleetscope_training_compute_seconds_median", r) for r in (0, 1)]
        comm = [value("fleetscope_training_comm_seconds_median", r) for r in (0, 1)]
        assert compute[1] > compute[0] + 0.01  # type: ignore[operator]
        assert comm[0] > comm[1] + 0.01  # type: ignore[operator]
