"""The Lightning Callback against a real (tiny, CPU) Trainer run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client.torchrun import assert_rank_1_is_the_slow_one, torchrun
from tests.conftest import requires_modules
from tests.push.live import running_daemon

pytestmark = requires_modules("torch", "lightning|pytorch_lightning")  # imported by the tests that use them


def test_trainer_reports_every_optimizer_step(tmp_path: Path) -> None:
    import torch

    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl

    from fleetscope.client.lightning import FleetscopeCallback
    from tests.client.lightning_worker import TinyModule

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
        trainer.fit(TinyModule(slow=False), loader)
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
    from tests.client.lightning_worker import SLOW_SECONDS

    with running_daemon() as daemon:
        torchrun(Path(__file__).with_name("lightning_worker.py"), daemon, "pl-ddp", PL_TEST_STEPS="20")
        assert_rank_1_is_the_slow_one(daemon, 20, SLOW_SECONDS)
