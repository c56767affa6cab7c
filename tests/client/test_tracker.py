from __future__ import annotations

import time

import pytest

from fleetscope.client import StepTracker
from fleetscope.push.store import RankView
from tests.push.live import LiveDaemon, running_daemon


def rank_view(daemon: LiveDaemon, job: str, rank: int = 0) -> RankView:
    (view,) = [r for r in daemon.collector.store.view().ranks if (r.job, r.rank) == (job, rank)]
    return view


class FakeScalar:
    """Something with .item(), as a 0-d tensor or numpy scalar has."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


def test_steps_and_phases_are_timed_and_pushed() -> None:
    with running_daemon() as daemon:
        tracker = StepTracker(job="loop", rank=3, local_rank=1, pp_stage=0, url=daemon.url, environ={})
        for _ in range(4):
            with tracker.step(tokens=100, samples=2) as step:
                with tracker.phase("data"):
                    time.sleep(0.002)
                with tracker.phase("compute"):
                    time.sleep(0.004)
                with tracker.phase("compute"):  # a phase entered twice adds up
                    time.sleep(0.004)
                with tracker.phase("comm"):
                    pass
                with tracker.phase("logging"):  # not a known phase: timed nowhere
                    time.sleep(0.001)
                step.loss = FakeScalar(0.5)
        tracker.close()
        view = rank_view(daemon, "loop", 3)
    assert view.steps == 4 and view.last_step == 4
    assert (view.local_rank, view.pp_stage) == (1, 0)
    assert view.seconds["data"] >= 4 * 0.002 and view.seconds["compute"] >= 4 * 0.008
    assert view.seconds["step"] >= view.seconds["data"] + view.seconds["compute"] + view.seconds["comm"]
    assert view.tokens == 400 and view.samples == 8 and view.loss == 0.5


def test_phase_before_the_step_counts_toward_it() -> None:
    with running_daemon() as daemon:
        tracker = StepTracker(job="carry", rank=0, url=daemon.url, environ={})
        with tracker.phase("data"):
            time.sleep(0.003)
        with tracker.step():
            pass
        with tracker.step():
            pass
        tracker.close()
        view = rank_view(daemon, "carry")
    assert view.steps == 2 and view.seconds["data"] >= 0.003


def test_failed_step_is_not_reported_and_its_exception_propagates() -> None:
    with running_daemon() as daemon:
        tracker = StepTracker(job="oom", rank=0, url=daemon.url, environ={})
        with pytest.raises(RuntimeError), tracker.step():
            raise RuntimeError("CUDA out of memory")
        with tracker.step(step=10):
            pass
        tracker.report(0.25)
        tracker.close()
        view = rank_view(daemon, "oom")
    assert view.steps == 2 and view.last_step == 11  # numbering continues after an explicit step


def test_report_with_own_timings() -> None:
    with running_daemon() as daemon:
        with StepTracker(job="manual", rank=1, url=daemon.url, environ={}) as tracker:
            tracker.report(
                1.0,
                step=7,
                data_seconds=0.1,
                compute_seconds=0.7,
                comm_seconds=0.2,
                tokens=FakeScalar(64),
                loss=2.0,
                timestamp=1_700_000_000.0,
            )
        view = rank_view(daemon, "manual", 1)
    assert view.seconds == {"step": 1.0, "data": 0.1, "compute": 0.7, "comm": 0.2}
    assert (view.tokens, view.loss, view.last_step_timestamp) == (64, 2.0, 1_700_000_000.0)


def test_report_never_raises_on_garbage() -> None:
    tracker = StepTracker(job="garbage", rank=0, url="http://127.0.0.1:9", environ={}, flush_interval=60)
    tracker.report(object())  # type: ignore[arg-type]
    tracker.report(1.0, tokens=FakeScalar)  # type: ignore[arg-type]  # .item is not callable without self
    tracker.close(timeout=5)
    assert tracker.errors == 1  # the second call failed inside report() and was counted
    stats = tracker.stats()
    assert (stats.enqueued, stats.rejected, stats.sent) == (1, 1, 0)  # the first could not be encoded


def test_environment_fills_in_job_rank_and_url() -> None:
    with running_daemon() as daemon:
        env = {
            "SLURM_JOB_ID": "4242",
            "SLURM_PROCID": "6",
            "SLURM_LOCALID": "2",
            "SLURM_NTASKS": "8",
            "FLEETSCOPE_PUSH_URL": daemon.url,
            "CUDA_VISIBLE_DEVICES": "2",
        }
        tracker = StepTracker(environ=env)
        tracker.report(0.5)
        tracker.close()
        view = rank_view(daemon, "4242", 6)
    assert (view.local_rank, view.world_size, view.gpu) == (2, 8, "2")


def test_cuda_events_fall_back_to_host_clock_without_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this test covers the no-GPU fallback")
    with running_daemon() as daemon:
        tracker = StepTracker(job="cpu", rank=0, url=daemon.url, environ={}, cuda_events=True)
        with tracker.step(), tracker.phase("compute"):
            time.sleep(0.002)
        tracker.close()
        assert rank_view(daemon, "cpu").seconds["compute"] >= 0.002
