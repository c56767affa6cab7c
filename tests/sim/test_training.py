from __future__ import annotations

import itertools
import statistics

import pytest

from fleetscope.sim.faults import parse_schedule
from fleetscope.sim.training import JobModel, JobSpec


def _run(faults=(), seconds=600.0, nodes=("n0", "n1")):
    job = JobModel(JobSpec("job-a", nodes, step_seconds=2.0), seed=3)
    records = [r for _, r in job.advance(seconds, 1_700_000_000.0, list(faults))]
    return job, records


def _by_rank(records, field):
    out: dict[int, list[float]] = {}
    for r in records:
        out.setdefault(r["rank"], []).append(r[field])
    return out


def test_healthy_ranks_step_together_with_a_few_percent_jitter():
    _, records = _run()
    steps = _by_rank(records, "step_seconds")
    assert set(steps) == set(range(16))
    # Synchronous: every rank sees the same step time for the same step.
    assert all(s == steps[0] for s in steps.values())
    spread = statistics.pstdev(steps[0]) / statistics.mean(steps[0])
    assert 0.005 < spread < 0.06
    compute = {rank: statistics.median(v) for rank, v in _by_rank(records, "compute_seconds").items()}
    assert max(compute.values()) / min(compute.values()) < 1.05
    for r in records:
        assert abs(r["data_seconds"] + r["compute_seconds"] + r["comm_seconds"] - r["step_seconds"]) < 1e-4


def test_a_throttled_gpu_makes_its_rank_compute_longer_and_the_others_wait():
    faults = parse_schedule([{"kind": "thermal_throttle", "at": 0, "node": "n1", "gpu": 2,
                              "params": {"slowdown": 1.3}}])
    job, records = _run(faults)
    slow = job.rank_on("n1", 2).rank
    assert slow == 10
    compute = {rank: statistics.median(v) for rank, v in _by_rank(records, "compute_seconds").items()}
    comm = {rank: statistics.median(v) for rank, v in _by_rank(records, "comm_seconds").items()}
    others = statistics.median(c for rank, c in compute.items() if rank != slow)
    # Host work keeps its pace: the compute grows by the accelerator share of the slowdown only.
    assert compute[slow] / others == pytest.approx(1 + JobSpec("x", ("n",)).accelerator_share * 0.3, rel=0.03)
    # Everyone else's extra time is spent waiting for rank 10 in the collective.
    for rank, c in comm.items():
        if rank != slow:
            assert c - comm[slow] == pytest.approx(compute[slow] - others, rel=0.2)


def test_ranks_leave_each_collective_milliseconds_apart():
    _, records = _run(seconds=100)
    ends = [r["timestamp"] for r in records if r["step"] == 10]
    assert len(ends) == 16 and 0.001 < max(ends) - min(ends) < 0.01


def test_slow_dataloader_shows_in_data_time_of_that_rank_only():
    faults = parse_schedule([{"kind": "slow_dataloader", "at": 0, "job": "job-a", "rank": 4}])
    _, records = _run(faults)
    data = {rank: statistics.median(v) for rank, v in _by_rank(records, "data_seconds").items()}
    step = statistics.median(r["step_seconds"] for r in records)
    assert data[4] / step > 0.25
    assert all(d / step < 0.05 for rank, d in data.items() if rank != 4)


def test_hang_stops_the_first_rank_then_the_rest():
    faults = parse_schedule([{"kind": "job_hang", "at": 100, "job": "job-a", "params": {"first_rank": 7, "lag": 20}}])
    job, records = _run(faults, seconds=300)
    last = {rank: max(r["timestamp"] for r in records if r["rank"] == rank) - 1_700_000_000.0 for rank in range(16)}
    assert last[7] <= 100
    assert all(100 < t <= 120 for rank, t in last.items() if rank != 7)
    assert job.busy() == 0.0


def test_a_dead_rank_stops_at_once_and_blocks_the_others_later():
    faults = parse_schedule([{"kind": "rank_dies", "at": 100, "job": "job-a", "rank": 3,
                              "params": {"block_after": 60}}])
    job, records = _run(faults, seconds=300)
    last = {rank: max(r["timestamp"] for r in records if r["rank"] == rank) - 1_700_000_000.0 for rank in range(16)}
    assert last[3] <= 100
    assert all(150 < t <= 160 for rank, t in last.items() if rank != 3)
    assert not job.ranks[3].alive and all(s.alive for s in job.ranks if s.rank != 3)


def test_drift_moves_the_job_speed_slowly():
    job = JobModel(JobSpec("job-a", ("n0",), step_seconds=2.0, jitter=0.0, drift_amplitude=0.05, drift_period=400.0),
                   seed=1)
    records = [r for _, r in job.advance(400.0, 0.0, [])]
    steps = [r["step_seconds"] for r in records if r["rank"] == 0]
    assert max(steps) / min(steps) > 1.07  # the drift is visible across a period...
    assert max(abs(a - b) / a for a, b in itertools.pairwise(steps)) < 0.03  # ...but never a jump
