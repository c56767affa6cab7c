"""The transformers TrainerCallback against a real (tiny, CPU) Trainer run."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetscope.client import StepTracker
from tests.client.torchrun import assert_rank_1_is_the_slow_one, torchrun
from tests.conftest import requires_modules
from tests.push.live import running_daemon

pytestmark = requires_modules("torch", "transformers", "accelerate")  # imported by the tests that use them


def test_trainer_reports_every_optimizer_step(tmp_path: Path) -> None:
    import transformers

    from fleetscope.client.hf import FleetscopeCallback
    from tests.client.hf_worker import Points, TinyRegression

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
            model=TinyRegression(slow=False), args=args, train_dataset=Points(64), callbacks=[callback]
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
    from tests.client.hf_worker import SLOW_SECONDS

    with running_daemon() as daemon:
        torchrun(Path(__file__).with_name("hf_worker.py"), daemon, "hf-ddp", str(tmp_path), HF_TEST_STEPS="20")
        assert_rank_1_is_the_slow_one(daemon, 20, SLOW_SECONDS)
