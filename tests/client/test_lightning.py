"""The Lightning Callback against a real (tiny, CPU) Trainer run."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
try:
    import lightning.pytorch as pl
except ImportError:
    pl = pytest.importorskip("pytorch_lightning")

from fleetscope.client.lightning import FleetscopeCallback  # noqa: E402
from tests.push.live import running_daemon  # noqa: E402


class TinyModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_trainer_reports_every_optimizer_step(tmp_path: Path) -> None:
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1)), batch_size=4)
    with running_daemon() as daemon:
        callback = FleetscopeCallback(job="pl-test", url=daemon.url, environ={})
        trainer = pl.Trainer(
            max_steps=5,
            accumulate_grad_batches=2,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
            callbacks=[callback],
        )
        trainer.fit(TinyModule(), loader)
        (view,) = daemon.collector.store.view().ranks
    values = view.values
    assert (view.job, view.rank, view.fields["local_rank"], view.fields["world_size"]) == ("pl-test", 0, 0, 1)
    assert values["steps"] == 5 and values["step"] == 5  # optimizer steps, not micro-batches
    assert values["samples"] == 5 * 2 * 4
    assert values["step_seconds"] > 0 and values["compute_seconds"] > 0 and values["comm_seconds"] >= 0
    parts = values["data_seconds"] + values["compute_seconds"] + values["comm_seconds"]
    assert parts == pytest.approx(values["step_seconds"])
    assert values["loss"] >= 0


@pytest.mark.slow
def test_ddp_ranks_report_the_slow_peers_wait_as_comm() -> None:
    """Two processes under torchrun (gloo), Lightning's DDP strategy: the callback watches strategy.model."""
    import os
    import subprocess
    import sys

    worker = Path(__file__).with_name("lightning_worker.py")
    with running_daemon() as daemon:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSCOPE_", "SLURM_"))}
        env.update({"FLEETSCOPE_PUSH_URL": daemon.url, "FLEETSCOPE_JOB": "pl-ddp", "OMP_NUM_THREADS": "1",
                    "GLOO_SOCKET_IFNAME": "lo", "PL_TEST_STEPS": "20"})
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(worker)],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        views = {view.rank: view.values for view in daemon.collector.store.view().ranks}
    assert sorted(views) == [0, 1] and views[0]["steps"] == views[1]["steps"] == 20
    # Rank 1's training step takes 30 ms longer: rank 0 waits for it in DDP's all-reduce.
    assert views[0]["comm_seconds"] > views[1]["comm_seconds"] + 20 * 0.015
    assert views[1]["compute_seconds"] > views[0]["compute_seconds"] + 20 * 0.015
