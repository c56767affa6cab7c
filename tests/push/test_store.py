from __future__ import annotations

import statistics
from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from fleetscope import wire
from fleetscope.config import PushConfig
from fleetscope.push.models import RankReport, reports_from_records
from fleetscope.push.store import ENDED_TTL, LimitExceeded, RankView, StepStore
from tests.clocks import FakeClock


def rec(job: str = "j", rank: int = 0, step: int = 0, step_seconds: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {"job": job, "rank": rank, "step": step, "step_seconds": step_seconds, **extra}


def push(store: StepStore, *records: dict[str, Any]) -> int:
    return store.ingest(reports_from_records(records)).accepted


def report(
    *steps: dict[str, Any], position: dict[str, Any] | None = None, job: str = "j", rank: int = 0, **fields: Any
) -> RankReport:
    return RankReport(job, rank, fields, list(steps), position)


def step(number: int, seconds: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {"step": number, "step_seconds": seconds, **extra}


def only(store: StepStore, job: str = "j", rank: int = 0) -> RankView:
    (view,) = [r for r in store.view().ranks if (r.job, r.rank) == (job, rank)]
    return view


def test_counters_sum_the_records_and_missing_fields_stay_absent() -> None:
    store = StepStore(PushConfig())
    push(store, rec(step=1, step_seconds=1.0, data_seconds=0.25, tokens=100))
    push(store, rec(step=2, step_seconds=2.0, data_seconds=0.5, tokens=50, loss=3.0))
    values = only(store).values
    assert values["steps"] == 2
    assert (values["step_seconds"], values["data_seconds"]) == (3.0, 0.75)
    assert "compute_seconds" not in values and "comm_seconds" not in values  # never pushed
    assert values["tokens"] == 150 and "samples" not in values
    assert values["step"] == 2 and values["loss"] == 3.0


def test_every_value_the_store_derives_has_a_key_in_value_keys() -> None:
    store = StepStore(PushConfig())
    full = {f.name: 1 for f in wire.STEP_FIELDS}
    push(store, rec(**{**full, "job": "j", "rank": 0, "timestamp": 999_999.0}))
    assert set(only(store).values) == set(wire.value_keys())


def test_last_loss_survives_records_without_loss() -> None:
    store = StepStore(PushConfig())
    push(store, rec(step=1, loss=2.0), rec(step=2), rec(step=3, loss=None))
    assert only(store).values["loss"] == 2.0


def test_median_covers_only_the_window_and_ignores_one_slow_step() -> None:
    store = StepStore(PushConfig(median_window=5))
    push(store, *(rec(step=i, step_seconds=100.0) for i in range(10)))  # old, outside the window
    push(store, *(rec(step=10 + i, step_seconds=s) for i, s in enumerate([1.0, 1.1, 60.0, 0.9, 1.2])))
    median = only(store).values["step_seconds_median"]
    assert median == pytest.approx(statistics.median([1.0, 1.1, 60.0, 0.9, 1.2])) == pytest.approx(1.1)


def test_median_window_is_per_rank() -> None:
    store = StepStore(PushConfig(median_window=3))
    push(store, *(rec(rank=0, step=i, step_seconds=1.0) for i in range(3)),
         *(rec(rank=1, step=i, step_seconds=5.0) for i in range(3)))
    assert only(store, rank=0).values["step_seconds_median"] == 1.0
    assert only(store, rank=1).values["step_seconds_median"] == 5.0


def test_timestamp_defaults_to_receive_time() -> None:
    clock = FakeClock(5000.0)
    store = StepStore(PushConfig(), clock)
    push(store, rec(step=1, timestamp=4990.0))
    assert only(store).values["timestamp"] == 4990.0
    push(store, rec(step=2))
    assert only(store).values["timestamp"] == 5000.0
    assert only(store).values["last_push"] == 5000.0


def test_job_limit_refuses_the_whole_batch() -> None:
    store = StepStore(PushConfig(max_jobs=2))
    push(store, rec(job="a"), rec(job="b"))
    before = store.view()
    with pytest.raises(LimitExceeded, match="max-jobs"):
        push(store, rec(job="a", step=1), rec(job="c"))
    after = store.view()
    assert after.records_total == before.records_total == 2
    assert only(store, job="a").values["steps"] == 1  # the valid part of the refused batch was not applied either


def test_rank_limit_refuses_the_whole_batch_but_known_ranks_keep_pushing() -> None:
    store = StepStore(PushConfig(max_ranks=3))
    push(store, *(rec(rank=r) for r in range(3)))
    with pytest.raises(LimitExceeded, match="max-ranks"):
        push(store, rec(rank=0, step=1), rec(rank=3))
    assert only(store, rank=0).values["steps"] == 1
    push(store, rec(rank=0, step=1))
    assert only(store, rank=0).values["steps"] == 2


def test_rank_expires_after_ttl_and_frees_its_slot() -> None:
    clock = FakeClock()
    store = StepStore(PushConfig(rank_ttl=60.0, max_ranks=2), clock)
    push(store, rec(rank=0), rec(rank=1))
    clock.now += 30
    push(store, rec(rank=1, step=1))
    clock.now += 45  # rank 0 silent for 75 s, rank 1 for 45 s
    view = store.view()
    assert [r.rank for r in view.ranks] == [1]
    assert view.expired == {"rank": 1}
    push(store, rec(rank=2))  # the expired rank's slot is free again
    clock.now += 61
    assert store.view().ranks == () and store.view().jobs == 0


def test_silent_rank_is_kept_until_ttl() -> None:
    clock = FakeClock()
    store = StepStore(PushConfig(rank_ttl=3600.0), clock)
    push(store, rec(rank=0))
    clock.now += 3599
    assert len(store.view().ranks) == 1


def test_end_job_removes_only_that_job() -> None:
    store = StepStore(PushConfig())
    push(store, rec(job="a", rank=0), rec(job="a", rank=1), rec(job="b", rank=0))
    assert store.end_job("a") == 2
    assert [(r.job, r.rank) for r in store.view().ranks] == [("b", 0)]
    assert store.view().jobs == 1
    assert store.end_job("a") == 0


def test_placement_follows_the_newest_record() -> None:
    store = StepStore(PushConfig())
    push(store, rec(local_rank=1, pp_stage=0, gpu="GPU-1", world_size=8))
    push(store, rec(step=1, local_rank=2))
    fields = only(store).fields
    assert (fields["local_rank"], fields["pp_stage"], fields["gpu"], fields["world_size"]) == (2, 0, "GPU-1", 8)


def test_view_is_a_snapshot() -> None:
    store = StepStore(PushConfig())
    push(store, rec(step_seconds=1.0))
    view = only(store)
    push(store, rec(step=1, step_seconds=1.0))
    assert view.values["steps"] == 1 and view.values["step_seconds"] == 1.0
    with pytest.raises(FrozenInstanceError):
        view.values = {}  # type: ignore[misc]


# -- reports, positions and bad input ---------------------------------------------------------------


def test_report_stores_steps_fields_and_position() -> None:
    clock = FakeClock()
    store = StepStore(PushConfig(), clock)
    result = store.ingest([report(step(1), step(2, data_seconds=0.5), position={"step": 3, "phase": "data",
                                                                                 "since": clock.now - 1},
                                  local_rank=2, pid=10, start_time=99)])
    assert (result.accepted, result.duplicate) == (2, 0)
    view = only(store)
    assert view.values["steps"] == 2 and view.values["data_seconds"] == 0.5
    assert view.fields["local_rank"] == 2 and view.process == (10, 99)
    assert view.position is not None
    assert (view.position.step, view.position.phase, view.position.since) == (3, "data", clock.now - 1)


def test_a_heartbeat_from_a_rank_never_seen_before_starts_tracking_it_without_steps() -> None:
    store = StepStore(PushConfig())
    store.ingest([report(position={"step": 1, "phase": "compute", "since": 999_000.0}, rank=5, pid=3,
                         start_time=1)])
    view = only(store, rank=5)
    assert view.values["steps"] == 0 and "step" not in view.values and "timestamp" not in view.values
    assert view.position is not None and view.position.phase == "compute"


def test_steps_a_process_already_reported_are_acknowledged_not_counted_again() -> None:
    store = StepStore(PushConfig())
    proc = {"pid": 7, "start_time": 1234}
    store.ingest([report(step(1), step(2), step(3), **proc)])
    result = store.ingest([report(step(2), step(3), step(5), step(4), **proc)])
    assert (result.accepted, result.duplicate) == (1, 3)
    view = only(store)
    assert view.values["steps"] == 4 and view.values["step"] == 5
    assert store.view().rejected == {"duplicate": 3}
    assert store.view().records_total == 4


def test_a_job_that_goes_back_to_a_checkpoint_in_process_keeps_reporting() -> None:
    """A re-send carries its first completion time; a step redone after a rollback completes later."""
    clock = FakeClock(10_000.0)
    store = StepStore(PushConfig(), clock)
    proc = {"pid": 7, "start_time": 1}
    store.ingest([report(step(100, timestamp=9_990.0), step(101, timestamp=9_995.0), **proc)])
    resent = store.ingest([report(step(101, timestamp=9_995.0), **proc)])
    clock.now += 10
    redone = store.ingest([report(step(50, timestamp=10_005.0), step(51, timestamp=10_008.0), **proc)])
    assert (resent.accepted, resent.duplicate, redone.accepted, redone.duplicate) == (0, 1, 2, 0)
    view = only(store)
    assert view.values["step"] == 51 and view.values["steps"] == 4
    # A clock far ahead is no rollback: the re-send of a future-stamped step stays a duplicate.
    assert store.ingest([report(step(3, timestamp=90_000.0), **proc)]).duplicate == 1


def test_a_restarted_rank_begins_again_at_step_zero() -> None:
    store = StepStore(PushConfig())
    store.ingest([report(step(40), step(41), pid=7, start_time=1000, position={"step": 42, "phase": "comm",
                                                                            "since": 999_999.0})])
    result = store.ingest([report(step(0), step(1), pid=8, start_time=5000)])  # a new process of rank 0
    assert (result.accepted, result.duplicate) == (2, 0)
    view = only(store)
    assert view.values["step"] == 1 and view.values["steps"] == 4  # counters keep counting
    assert view.position is None  # the old process's position is not the new one's
    assert view.process == (8, 5000)


def test_steps_without_a_process_keep_the_old_newest_wins_order() -> None:
    store = StepStore(PushConfig())
    push(store, rec(step=10), rec(step=3))
    assert only(store).values["step"] == 3 and store.view().rejected == {}


def test_a_clock_that_goes_backwards_or_runs_ahead_never_makes_progress_look_older() -> None:
    clock = FakeClock(10_000.0)
    store = StepStore(PushConfig(), clock)
    proc = {"pid": 7, "start_time": 1}
    store.ingest([report(step(1, timestamp=9_999.0), **proc)])
    clock.now += 10
    store.ingest([report(step(2, timestamp=5_000.0), **proc)])  # the rank's clock jumped back
    assert only(store).values["timestamp"] == 10_010.0  # when the daemon heard of the step
    clock.now += 10
    store.ingest([report(step(3, timestamp=90_000.0), position={"step": 4, "phase": "data", "since": 90_000.0},
                         **proc)])
    view = only(store)
    assert view.values["timestamp"] == 10_020.0
    assert view.position is not None and view.position.since == 10_020.0
    assert store.view().rejected == {"clock": 3}


def test_an_ended_rank_expires_sooner() -> None:
    clock = FakeClock()
    store = StepStore(PushConfig(rank_ttl=3600.0), clock)
    store.ingest([report(step(1), rank=0, position={"step": 2, "phase": "ended", "since": clock.now})])
    store.ingest([report(step(1), rank=1, position={"step": 2, "phase": "idle", "since": clock.now})])
    clock.now += ENDED_TTL + 1
    assert [r.rank for r in store.view().ranks] == [1]


def test_a_rank_restarted_inside_the_same_process_is_a_new_session() -> None:
    store = StepStore(PushConfig())
    store.ingest([report(step(30), pid=7, start_time=1000, session=1)])
    result = store.ingest([report(step(0), step(1), pid=7, start_time=1000, session=2)])  # a simulator's restart
    assert (result.accepted, result.duplicate) == (2, 0)
    assert store.ingest([report(step(1), pid=7, start_time=1000, session=2)]).duplicate == 1


def test_huge_steps_cannot_turn_a_total_infinite() -> None:
    """#18 item 12: step_seconds 1e308 twice made the seconds counter +Inf; the wire bound refuses it."""
    from fleetscope.push.models import RecordError, parse_records

    store = StepStore(PushConfig())
    for number in (1, 2):
        with pytest.raises(RecordError):
            parse_records(b'{"job": "j", "rank": 0, "step": %d, "step_seconds": 1e308}' % number)
    push(store, *(rec(step=n, step_seconds=wire.MAX_STEP_SECONDS) for n in range(1, 1001)))
    assert only(store).values["step_seconds"] == 1000 * wire.MAX_STEP_SECONDS


def test_a_timestamp_far_in_the_future_does_not_hide_a_hang() -> None:
    """#18 item 12: timestamp 1e300 kept the last step 'in the future', so the job never looked stalled."""
    clock = FakeClock(5000.0)
    store = StepStore(PushConfig(), clock)
    push(store, rec(step=1, timestamp=1e300))
    assert only(store).values["timestamp"] == 5000.0


def healthy_rank(store: StepStore, clock: FakeClock, first: int, seconds: int) -> int:
    """A rank completing a step a second, stamped on the node's wall clock, reporting once a second."""
    proc = {"pid": 7, "start_time": 1}
    for number in range(first, first + seconds):
        clock.now += 1
        store.ingest([report(step(number, timestamp=clock.wall - 0.2),
                             position={"step": number + 1, "phase": "data", "since": clock.wall - 0.1}, **proc)])
    return first + seconds


def test_a_wall_clock_set_back_600_s_neither_freezes_progress_nor_rejects_steps() -> None:
    """#30 item 4: set back 600 s, the last-step time froze and 401 steps in 40 s were refused as `clock`."""
    clock = FakeClock(1_700_000_000.0)
    store = StepStore(PushConfig(), clock)
    number = healthy_rank(store, clock, 1, 60)
    clock.step(-600)
    number = healthy_rank(store, clock, number, 40)
    view = store.view()
    values = only(store).values
    assert values["steps"] == 100 and view.rejected == {}
    # Every time is on the wall clock of the view: the newest step 0.2 s ago, the last push just now.
    assert view.wall - values["timestamp"] == pytest.approx(0.2)
    assert view.wall - values["last_push"] == pytest.approx(0.0)
    position = only(store).position
    assert position is not None and view.wall - position.since == pytest.approx(0.1)


def test_a_wall_clock_set_forward_2_h_keeps_every_rank() -> None:
    """#30 item 4: set forward 2 h, every rank expired at once (steps_total 469 -> 30)."""
    clock = FakeClock(1_700_000_000.0)
    store = StepStore(PushConfig(rank_ttl=300.0), clock)
    number = healthy_rank(store, clock, 1, 60)
    clock.step(7200)
    healthy_rank(store, clock, number, 30)
    view = store.view()
    assert only(store).values["steps"] == 90 and view.expired == {} and view.rejected == {}
    assert view.wall - only(store).values["timestamp"] == pytest.approx(0.2)


def test_a_step_read_across_a_wall_clock_step_is_placed_when_it_arrived() -> None:
    """A stamp taken before the clock was set back arrives "in the future"; one taken before it was set
    forward arrives 2 h old: each is placed at its arrival, counted as `clock`, and progress never goes back."""
    clock = FakeClock(1_700_000_000.0)
    store = StepStore(PushConfig(), clock)
    proc = {"pid": 7, "start_time": 1}
    store.ingest([report(step(1, timestamp=clock.wall - 0.5), **proc)])
    stamped = clock.wall
    clock.now += 1
    clock.step(-600)
    store.ingest([report(step(2, timestamp=stamped), **proc)])
    assert store.view().wall - only(store).values["timestamp"] == pytest.approx(0.0)
    stamped = clock.wall
    clock.now += 1
    clock.step(7200)
    store.ingest([report(step(3, timestamp=stamped), **proc)])
    view = store.view()
    assert view.wall - only(store).values["timestamp"] == pytest.approx(0.0)
    assert view.rejected == {"clock": 2}


def test_ranks_expire_on_the_monotonic_clock() -> None:
    clock = FakeClock()
    store = StepStore(PushConfig(rank_ttl=60.0), clock)
    push(store, rec(rank=0))
    clock.step(-3600)
    clock.now += 61  # time that passed, whatever the wall clock says
    assert store.view().ranks == ()
    assert store.view().expired == {"rank": 1}


# -- ranks belong to their process (#35 item 5) -------------------------------------------------------------

LEASE = "a" * 32
OTHER = "b" * 32
PROCESS = {"pid": 4242, "start_time": 77, "session": 1}


def leased(*steps: dict[str, Any], lease: str | None = LEASE, position: dict[str, Any] | None = None,
           **fields: Any) -> RankReport:
    return RankReport("j", 0, {**PROCESS, **fields}, list(steps), position, lease)


def test_a_live_ranks_steps_phases_and_job_belong_to_its_process() -> None:
    from fleetscope.push.store import LeaseHeld
    living = {(4242, 77): True}
    store = StepStore(PushConfig(), alive=lambda pid, start: living.get((pid, start)))
    store.ingest([leased(*(step(n, 0.1) for n in range(1, 51)))])
    forged = [leased(*(step(n, 999.0) for n in range(51, 91)), lease=OTHER),  # 40 steps of 999 s
              leased(step(51, 999.0), lease=None),
              leased(lease=OTHER, position={"step": 51, "phase": "ended", "since": 1.0})]
    for report_ in forged:
        with pytest.raises(LeaseHeld):
            store.ingest([report_])
    with pytest.raises(LeaseHeld):
        store.end_job("j")
    with pytest.raises(LeaseHeld):
        store.end_job("j", OTHER)
    view = only(store)
    assert view.values["steps"] == 50 and view.values["step_seconds_median"] == pytest.approx(0.1)
    assert view.position is None and "lease" not in view.fields  # never kept as a fact, never exported
    store.ingest([leased(step(51, 0.1))])  # its own process goes on
    assert store.end_job("j", LEASE) == 1  # and a rank of the job may end it


def test_a_lease_lapses_when_its_process_ends_says_goodbye_or_cannot_be_seen_for_a_while() -> None:
    from fleetscope.push.store import LEASE_IDLE, LeaseHeld
    clock = FakeClock()
    living: dict[tuple[int, int], bool | None] = {(4242, 77): True}
    store = StepStore(PushConfig(), clock, alive=lambda pid, start: living.get((pid, start)))
    store.ingest([leased(step(1))])
    living[(4242, 77)] = False  # the process died: a restart of the rank takes over
    store.ingest([RankReport("j", 0, {"pid": 5000, "start_time": 90, "session": 2}, [step(1)], None, OTHER)])
    living[(5000, 90)] = None  # a process this daemon cannot see: its lease holds while it reports
    with pytest.raises(LeaseHeld):
        store.ingest([leased(step(2))])
    clock.now += LEASE_IDLE + 1
    store.ingest([leased(step(2))])
    store.ingest([leased(position={"step": 3, "phase": "ended", "since": 1.0})])  # goodbye: the lease goes
    store.ingest([leased(step(3), lease=OTHER, pid=6000)])
    assert only(store).values["steps"] == 4  # each process's steps once


def test_a_refused_push_changes_nothing_so_its_retry_counts_once() -> None:
    """A push that fails half-way (one rank refused, or an error applying it) stores nothing of it."""
    from fleetscope.push.store import LeaseHeld
    store = StepStore(PushConfig(), alive=lambda pid, start: True)
    store.ingest([RankReport("j", 1, PROCESS, [step(1)], None, OTHER)])
    batch = [leased(step(1), step(2)), RankReport("j", 1, PROCESS, [step(2)], None, LEASE)]
    with pytest.raises(LeaseHeld):
        store.ingest(batch)
    assert [r.values["steps"] for r in store.view().ranks] == [1]  # rank 0 not created, rank 1 unchanged
    store.ingest([leased(step(1), step(2))])
    assert only(store).values["steps"] == 2


def test_an_error_half_way_through_a_push_leaves_the_store_as_it_was(monkeypatch) -> None:
    store = StepStore(PushConfig())
    store.ingest([leased(step(1))])
    real = StepStore._add_step_locked
    calls = []

    def fails_on_the_third(state: Any, step_: Any, now: Any) -> int:
        calls.append(step_)
        if len(calls) == 3:
            raise RuntimeError("half-way")
        return real(state, step_, now)

    monkeypatch.setattr(StepStore, "_add_step_locked", staticmethod(fails_on_the_third))
    with pytest.raises(RuntimeError):
        store.ingest([leased(step(2), step(3), step(4))])
    monkeypatch.setattr(StepStore, "_add_step_locked", staticmethod(real))
    assert only(store).values["steps"] == 1
    store.ingest([leased(step(2), step(3), step(4))])  # the retry
    assert only(store).values["steps"] == 4


def test_a_restarted_daemon_adopts_the_lease_the_rank_still_sends() -> None:
    """A daemon restart forgets the leases; the rank's next report (re-sent steps too) brings its own back."""
    from fleetscope.push.store import LeaseHeld
    before = StepStore(PushConfig(), alive=lambda pid, start: True)
    before.ingest([leased(step(1), step(2))])
    after = StepStore(PushConfig(), alive=lambda pid, start: True)  # the new daemon process
    after.ingest([leased(step(2), step(3))])  # the batch the old one may or may not have stored, and a new step
    with pytest.raises(LeaseHeld):
        after.ingest([leased(step(4, 999.0), lease=OTHER)])
    assert only(after).values["steps"] == 2
