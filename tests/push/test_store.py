from __future__ import annotations

import statistics
from dataclasses import FrozenInstanceError

import pytest

from fleetscope.config import PushConfig
from fleetscope.push.models import StepRecord
from fleetscope.push.store import LimitExceeded, StepStore


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rec(
    job: str = "j", rank: int = 0, step: int = 0, step_seconds: float = 1.0, **extra: object
) -> StepRecord:
    return StepRecord(job=job, rank=rank, step=step, step_seconds=step_seconds, **extra)  # type: ignore[arg-type]


def only(store: StepStore, job: str = "j", rank: int = 0):  # type: ignore[no-untyped-def]
    (view,) = [r for r in store.view().ranks if (r.job, r.rank) == (job, rank)]
    return view


def test_counters_sum_the_records_and_missing_fields_stay_absent() -> None:
    store = StepStore(PushConfig())
    store.ingest([rec(step=1, step_seconds=1.0, data_seconds=0.25, tokens=100)])
    store.ingest([rec(step=2, step_seconds=2.0, data_seconds=0.5, tokens=50, loss=3.0)])
    view = only(store)
    assert view.steps == 2
    assert view.seconds == {"step": 3.0, "data": 0.75}  # compute and comm were never pushed
    assert view.tokens == 150 and view.samples is None
    assert view.last_step == 2 and view.loss == 3.0


def test_last_loss_survives_records_without_loss() -> None:
    store = StepStore(PushConfig())
    store.ingest([rec(step=1, loss=2.0), rec(step=2)])
    assert only(store).loss == 2.0


def test_median_covers_only_the_window_and_ignores_one_slow_step() -> None:
    store = StepStore(PushConfig(median_window=5))
    store.ingest([rec(step=i, step_seconds=100.0) for i in range(10)])  # old, outside the window
    store.ingest([rec(step=10 + i, step_seconds=s) for i, s in enumerate([1.0, 1.1, 60.0, 0.9, 1.2])])
    assert only(store).medians["step"] == pytest.approx(statistics.median([1.0, 1.1, 60.0, 0.9, 1.2]))
    assert only(store).medians["step"] == pytest.approx(1.1)


def test_median_window_is_per_rank() -> None:
    store = StepStore(PushConfig(median_window=3))
    store.ingest(
        [rec(rank=0, step=i, step_seconds=1.0) for i in range(3)]
        + [rec(rank=1, step=i, step_seconds=5.0) for i in range(3)]
    )
    assert only(store, rank=0).medians["step"] == 1.0
    assert only(store, rank=1).medians["step"] == 5.0


def test_timestamp_defaults_to_receive_time() -> None:
    clock = FakeClock(5000.0)
    store = StepStore(PushConfig(), clock)
    store.ingest([rec(step=1)])
    store.ingest([rec(step=2, timestamp=4990.0)])
    assert only(store).last_step_timestamp == 4990.0
    assert only(store).last_push_timestamp == 5000.0


def test_job_limit_refuses_the_whole_batch() -> None:
    store = StepStore(PushConfig(max_jobs=2))
    store.ingest([rec(job="a"), rec(job="b")])
    before = store.view()
    with pytest.raises(LimitExceeded, match="max-jobs"):
        store.ingest([rec(job="a", step=1), rec(job="c")])
    after = store.view()
    assert after.records_total == before.records_total == 2
    assert only(store, job="a").steps == 1  # the valid part of the refused batch was not applied either


def test_rank_limit_refuses_the_whole_batch_but_known_ranks_keep_pushing() -> None:
    store = StepStore(PushConfig(max_ranks=3))
    store.ingest([rec(rank=r) for r in range(3)])
    with pytest.raises(LimitExceeded, match="max-ranks"):
        store.ingest([rec(rank=0, step=1), rec(rank=3)])
    assert only(store, rank=0).steps == 1
    store.ingest([rec(rank=0, step=1)])
    assert only(store, rank=0).steps == 2


def test_rank_expires_after_ttl_and_frees_its_slot() -> None:
    clock = FakeClock()
    store = StepStore(PushConfig(rank_ttl=60.0, max_ranks=2), clock)
    store.ingest([rec(rank=0), rec(rank=1)])
    clock.now += 30
    store.ingest([rec(rank=1, step=1)])
    clock.now += 45  # rank 0 silent for 75 s, rank 1 for 45 s
    view = store.view()
    assert [r.rank for r in view.ranks] == [1]
    assert view.expired == {"rank": 1}
    store.ingest([rec(rank=2)])  # the expired rank's slot is free again
    clock.now += 61
    assert store.view().ranks == () and store.view().jobs == 0


def test_silent_rank_is_kept_until_ttl() -> None:
    clock = FakeClock()
    store = StepStore(PushConfig(rank_ttl=3600.0), clock)
    store.ingest([rec(rank=0)])
    clock.now += 3599
    assert len(store.view().ranks) == 1


def test_end_job_removes_only_that_job() -> None:
    store = StepStore(PushConfig())
    store.ingest([rec(job="a", rank=0), rec(job="a", rank=1), rec(job="b", rank=0)])
    assert store.end_job("a") == 2
    assert [(r.job, r.rank) for r in store.view().ranks] == [("b", 0)]
    assert store.view().jobs == 1
    assert store.end_job("a") == 0


def test_placement_follows_the_newest_record() -> None:
    store = StepStore(PushConfig())
    store.ingest([rec(local_rank=1, pp_stage=0, gpu="GPU-1", world_size=8)])
    store.ingest([rec(step=1, local_rank=2)])
    view = only(store)
    assert (view.local_rank, view.pp_stage, view.gpu, view.world_size) == (2, 0, "GPU-1", 8)


def test_view_is_a_snapshot() -> None:
    store = StepStore(PushConfig())
    store.ingest([rec(step_seconds=1.0)])
    view = only(store)
    store.ingest([rec(step=1, step_seconds=1.0)])
    assert view.steps == 1 and view.seconds["step"] == 1.0
    with pytest.raises(FrozenInstanceError):
        view.steps = 6  # type: ignore[misc]
