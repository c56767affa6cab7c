"""The simulated jobs have the shapes of real synchronous data-parallel training."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from fleetscope_sim.faults import parse_schedule
from fleetscope_sim.training import JobModel, JobSpec

T0 = 1_700_000_000.0


def _run(faults=(), seconds=600.0, nodes=("n0", "n1"), **spec):
    job = JobModel(JobSpec("job-a", nodes, step_seconds=2.0, **spec), seed=3)
    records = [r for _, r in job.advance(seconds, T0, list(faults))]
    return job, records


def _by_rank(records, field):
    out: dict[int, list[float]] = {}
    for r in records:
        out.setdefault(r["rank"], []).append(r[field])
    return out


def _last(records):
    """rank -> (last completed step, its timestamp in simulation time)."""
    out = {}
    for r in records:
        out[r["rank"]] = (r["step"], r["timestamp"] - T0)
    return out


def test_healthy_ranks_step_together_with_a_few_percent_jitter():
    _, records = _run()
    steps = _by_rank(records, "step_seconds")
    assert set(steps) == set(range(16))
    # Synchronous: every rank completes the same steps, each within milliseconds of the others.
    assert len({len(s) for s in steps.values()}) == 1
    for step in zip(*steps.values(), strict=True):
        assert max(step) - min(step) < 0.02
    spread = statistics.pstdev(steps[0]) / statistics.mean(steps[0])
    assert 0.005 < spread < 0.06
    compute = {rank: statistics.median(v) for rank, v in _by_rank(records, "compute_seconds").items()}
    assert max(compute.values()) / min(compute.values()) < 1.05
    for r in records:
        assert abs(r["data_seconds"] + r["compute_seconds"] + r["comm_seconds"] - r["step_seconds"]) < 1e-4
    # Ranks leave each collective a few milliseconds apart, as real ones do.
    ends = [r["timestamp"] for r in records if r["step"] == 10]
    assert 0.001 < max(ends) - min(ends) < 0.01


def test_a_throttled_gpu_stretches_only_its_accelerator_time_and_the_others_wait_in_comm():
    faults = parse_schedule([{"kind": "thermal_throttle", "at": 0, "node": "n1", "gpu": 2,
                              "params": {"slowdown": 1.5}}])
    job, records = _run(faults)
    slow = job.rank_on("n1", 2).rank
    assert slow == 10
    compute = {rank: statistics.median(v) for rank, v in _by_rank(records, "compute_seconds").items()}
    comm = {rank: statistics.median(v) for rank, v in _by_rank(records, "comm_seconds").items()}
    others = statistics.median(c for rank, c in compute.items() if rank != slow)
    # Host work keeps its pace: the compute grows by the accelerator share of the slowdown only.
    share = JobSpec("x", ("n",)).accelerator_share
    assert compute[slow] / others == pytest.approx(1 + share * 0.5, rel=0.03)
    # Everyone else's extra time is spent waiting for rank 10 in the collective.
    extra = compute[slow] - others
    for rank, c in comm.items():
        if rank != slow:
            assert c - comm[slow] == pytest.approx(extra, rel=0.15)


def test_slow_dataloader_shows_in_data_time_of_that_rank_and_in_the_others_comm():
    faults = parse_schedule([{"kind": "slow_dataloader", "at": 0, "job": "job-a", "rank": 4}])
    _, records = _run(faults)
    data = {rank: statistics.median(v) for rank, v in _by_rank(records, "data_seconds").items()}
    comm = {rank: statistics.median(v) for rank, v in _by_rank(records, "comm_seconds").items()}
    step = statistics.median(r["step_seconds"] for r in records)
    assert data[4] / step > 0.25
    assert all(d / step < 0.05 for rank, d in data.items() if rank != 4)
    assert all(c > comm[4] + 0.5 for rank, c in comm.items() if rank != 4)


def test_a_hung_rank_stalls_inside_a_step_and_its_peers_wait_in_the_collective():
    faults = parse_schedule([{"kind": "job_hang", "at": 100, "job": "job-a", "rank": 7}])
    job, records = _run(faults, seconds=300)
    last = _last(records)
    # Every rank completed the same last step, within milliseconds of each other: the one in progress
    # at t=100 if rank 7 was past its data wait then, else the one before.
    assert len({step for step, _ in last.values()}) == 1
    times = [t for _, t in last.values()]
    assert 97 < max(times) < 103 and max(times) - min(times) < 0.01
    (step_number,) = {step for step, _ in last.values()}
    assert job.stuck() and job.busy(300.0) == 0.0
    assert job.gpu_busy(7, 300.0) == 0.0 and job.gpu_busy(6, 300.0) > 0.9  # waiting for input: its GPU idles
    # Inside the open step: the culprit in its data phase, everyone else waiting in comm.
    culprit = job.position(7, 300.0)
    assert culprit is not None and (culprit.step, culprit.phase) == (step_number + 1, "data")
    for rank in range(16):
        if rank != 7:
            peer = job.position(rank, 300.0)
            assert peer is not None and (peer.step, peer.phase) == (step_number + 1, "comm")
            assert culprit.since <= peer.since < 104


def test_a_stall_in_compute_leaves_the_culprit_in_compute():
    faults = parse_schedule([{"kind": "job_hang", "at": 100, "job": "job-a", "rank": 3,
                              "params": {"phase": "compute"}}])
    job, _ = _run(faults, seconds=200)
    assert job.position(3, 200.0).phase == "compute"
    assert job.position(4, 200.0).phase == "comm"
    # A kernel that never finishes and NCCL kernels spinning in the collective keep every GPU busy.
    assert job.gpu_busy(3, 200.0) > 0.9 and job.gpu_busy(4, 200.0) > 0.9 and job.busy(200.0) == 0


def test_a_stall_that_ends_is_one_long_step_for_everyone():
    faults = parse_schedule([{"kind": "job_hang", "at": 100, "duration": 30, "job": "job-a", "rank": 3}])
    job, records = _run(faults, seconds=300)
    assert not job.stuck()
    long = [r for r in records if r["step_seconds"] > 20]
    assert {r["rank"] for r in long} == set(range(16)) and len({r["step"] for r in long}) == 1
    by_rank = {r["rank"]: r for r in long}
    assert by_rank[3]["data_seconds"] > 25 and by_rank[3]["comm_seconds"] < 1
    assert by_rank[4]["comm_seconds"] > 25 and by_rank[4]["data_seconds"] < 1


def test_a_dead_rank_leaves_its_peers_waiting_in_the_collective_of_that_step():
    faults = parse_schedule([{"kind": "rank_dies", "at": 100, "job": "job-a", "rank": 3}])
    job, records = _run(faults, seconds=300)
    last = _last(records)
    assert len({step for step, _ in last.values()}) == 1 and max(t for _, t in last.values()) <= 100
    assert not job.ranks[3].alive and all(s.alive for s in job.ranks if s.rank != 3)
    assert job.position(3, 300.0) is None  # its process is gone: nothing reports for it
    assert all(job.position(r, 300.0).phase == "comm" for r in range(16) if r != 3)
    assert job.stuck()
    assert job.gpu_busy(3, 300.0) == 0 and job.gpu_busy(4, 300.0) > 0.9  # the peers' NCCL kernels spin


def test_a_rank_is_alive_until_the_moment_it_dies():
    faults = parse_schedule([{"kind": "rank_dies", "at": 100, "job": "job-a", "rank": 3}])
    job = JobModel(JobSpec("job-a", ("n0",), step_seconds=2.0), seed=3)
    job.advance(99.0, T0, list(faults))
    assert job.ranks[3].alive and not job.stuck(99.0)
    job.advance(101.0, T0, list(faults))
    assert not job.ranks[3].alive and job.stuck(101.0)


def test_drift_moves_the_job_speed_slowly():
    job = JobModel(JobSpec("job-a", ("n0",), step_seconds=2.0, jitter=0.0, drift_amplitude=0.05, drift_period=400.0),
                   seed=1)
    records = [r for _, r in job.advance(400.0, 0.0, [])]
    steps = [r["step_seconds"] for r in records if r["rank"] == 0]
    assert max(steps) / min(steps) > 1.07  # the drift is visible across a period...
    assert max(abs(a - b) / a for a, b in itertools.pairwise(steps)) < 0.03  # ...but never a jump
    assert not math.isinf(max(steps))
