"""A real 2-process torch.distributed (gloo, CPU) DDP run, instrumented as the README shows, through a real daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client.torchrun import assert_rank_1_is_the_slow_one, torchrun
from tests.conftest import requires_modules
from tests.push.live import running_daemon

pytestmark = requires_modules("torch")  # imported by the ranks, not at collection

STEPS = 30


@pytest.mark.slow
def test_two_rank_gloo_training_shows_per_rank_series() -> None:
    from tests.client.gloo_worker import SLOW_SECONDS

    with running_daemon() as daemon:
        # torchrun itself here (its elastic agent starts the ranks); the other multi-process tests start them
        # with the environment it gives them
        torchrun(Path(__file__).with_name("gloo_worker.py"), daemon, "gloo-ddp", elastic_agent=True,
                 GLOO_TEST_STEPS=str(STEPS))

        def value(name: str, rank: int, **labels: str) -> float | None:
            return daemon.value(name, training_job="gloo-ddp", rank=str(rank), local_rank=str(rank), **labels)

        for rank in (0, 1):
            assert value("fleetscope_training_steps_total", rank) == STEPS
            assert value("fleetscope_training_last_step", rank) == STEPS
            assert value("fleetscope_training_samples_total", rank) == STEPS * 16
            step_total = value("fleetscope_training_step_seconds_total", rank)
            parts = [value(f"fleetscope_training_{p}_seconds_total", rank) for p in ("data", "compute", "comm")]
            assert step_total is not None and None not in parts
            assert sum(parts) == pytest.approx(step_total)  # type: ignore[arg-type]
            # torchrun, every GPU visible: the rank's GPU is cuda:LOCAL_RANK
            assert value("fleetscope_training_rank_info", rank, world_size="2", gpu=str(rank)) == 1
            assert value("fleetscope_training_phase", rank, phase="ended") == 1  # the tracker said goodbye
        # Rank 1's accelerator takes 60 ms longer per step; synchronous training turns that into
        # rank 0's collective wait, which watch() books as comm.
        assert_rank_1_is_the_slow_one(daemon, STEPS, SLOW_SECONDS)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["fsdp2", "fsdp1"])
def test_fsdp_books_the_slow_peers_wait_in_its_collectives_as_comm(model: str) -> None:
    # The e2e rank script (README instrumentation: watch() + steps(loader)), 2 ranks, rank 1's accelerator
    # share twice as long: 100 ms more per step, which rank 0 spends in FSDP's all-gathers and reduce-scatters.
    # (At 40 ms the host's own share of a step, about 0.1 s on the suite's loaded cores, blurred the two ranks'
    # compute medians to 19 ms apart in r21.)
    steps, device_ms, slowdown = 30, 100.0, 1.0
    worker = Path(__file__).parents[1] / "e2e" / "gloo_rank.py"
    with running_daemon() as daemon:
        torchrun(worker, daemon, f"gloo-{model}", "--model", model, "--steps", str(steps),
                 "--device-ms", str(device_ms), "--slow-rank", "1", "--slowdown", str(slowdown), "--width", "32")
        assert_rank_1_is_the_slow_one(daemon, steps, device_ms / 1000 * slowdown)
