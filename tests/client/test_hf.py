"""The transformers TrainerCallback against a real (tiny, CPU) Trainer run."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from fleetscope.client import StepTracker  # noqa: E402
from fleetscope.client.hf import FleetscopeCallback  # noqa: E402
from tests.push.live import running_daemon  # noqa: E402


class TinyRegression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)
        return {"loss": loss}


class Points(torch.utils.data.Dataset):
    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(count, 4, generator=generator)
        self.y = self.x.sum(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}


def test_trainer_reports_every_optimizer_step(tmp_path: Path) -> None:
    with running_daemon() as daemon:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path),
            max_steps=6,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        callback = FleetscopeCallback(tracker=None, job="hf-test", url=daemon.url, environ={})
        trainer = transformers.Trainer(
            model=TinyRegression(), args=args, train_dataset=Points(64), callbacks=[callback]
        )
        trainer.train()
        assert isinstance(callback.tracker, StepTracker)
        (view,) = daemon.collector.store.view().ranks
    assert (view.job, view.rank) == ("hf-test", 0)
    values = view.values
    assert values["steps"] == 6 and values["step"] == 6  # optimizer steps, not micro-batches
    assert values["samples"] == 6 * 4 * 2
    assert values["step_seconds"] > 0 and values["compute_seconds"] > 0
    # comm is the gradients' exposed all-reduce, measured on the model the Trainer trains (0 in one process)
    assert values["comm_seconds"] >= 0
    parts = values["data_seconds"] + values["compute_seconds"] + values["comm_seconds"]
    assert parts == pytest.approx(values["step_seconds"])
    assert values["loss"] >= 0


@pytest.mark.slow
def test_ddp_ranks_report_the_slow_peers_wait_as_comm(tmp_path: Path) -> None:
    """Two processes under torchrun (gloo): the Trainer wraps the model in DDP out of the callback's reach."""
    import os
    import subprocess
    import sys

    worker = Path(__file__).with_name("hf_worker.py")
    with running_daemon() as daemon:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSCOPE_", "SLURM_"))}
        env.update({"FLEETSCOPE_PUSH_URL": daemon.url, "FLEETSCOPE_JOB": "hf-ddp", "OMP_NUM_THREADS": "1",
                    "GLOO_SOCKET_IFNAME": "lo", "HF_TEST_STEPS": "20"})
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(worker),
             str(tmp_path)],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        views = {view.rank: view.values for view in daemon.collector.store.view().ranks}
    assert sorted(views) == [0, 1] and views[0]["steps"] == views[1]["steps"] == 20
    # Rank 1's forward takes 30 ms longer: rank 0 waits for it in DDP's all-reduce.
    assert views[0]["comm_seconds"] > views[1]["comm_seconds"] + 20 * 0.015
    assert views[1]["compute_seconds"] > views[0]["compute_seconds"] + 20 * 0.015
