from __future__ import annotations

import os

import pytest

from fleetscope.client.placement import (
    DEFAULT_URL,
    RANK_PROCESS_VAR,
    claim_rank,
    detect,
    node_gpu,
    process_start_time,
    push_url,
    rank_reported_above,
)


def test_torchrun_environment() -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "16", "TORCHELASTIC_RUN_ID": "run-42"}
    placement = detect(environ=env)
    assert (placement.job, placement.rank, placement.local_rank, placement.world_size) == ("run-42", 5, 1, 16)


def test_slurm_environment() -> None:
    env = {"SLURM_JOB_ID": "9001", "SLURM_PROCID": "7", "SLURM_LOCALID": "3", "SLURM_NTASKS": "8"}
    placement = detect(environ=env)
    assert (placement.job, placement.rank, placement.local_rank, placement.world_size) == ("9001", 7, 3, 8)


def test_torchrun_inside_slurm_takes_torchrun_ranks_and_slurm_job() -> None:
    env = {
        "SLURM_JOB_ID": "9001",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "RANK": "12",
        "LOCAL_RANK": "4",
        "WORLD_SIZE": "16",
        "TORCHELASTIC_RUN_ID": "none",
    }
    placement = detect(environ=env)
    assert (placement.job, placement.rank, placement.local_rank, placement.world_size) == ("9001", 12, 4, 16)


def test_arguments_win_and_defaults_fill_in() -> None:
    env = {"RANK": "5", "FLEETSCOPE_JOB": "from-env"}
    assert detect(job="mine", rank=2, environ=env).rank == 2
    assert detect(environ=env).job == "from-env"
    bare = detect(environ={"TORCHELASTIC_RUN_ID": "none"})
    assert (bare.rank, bare.local_rank, bare.world_size) == (0, None, None)
    assert bare.job != "unknown" and str(os.getpid()) in bare.job  # a job of its own (#35 item 5)


def test_push_url() -> None:
    assert push_url(environ={}) == DEFAULT_URL == "http://127.0.0.1:9402"
    assert push_url(environ={"FLEETSCOPE_PUSH_URL": "http://10.0.0.5:9402/"}) == "http://10.0.0.5:9402"
    assert push_url("http://x:1", environ={"FLEETSCOPE_PUSH_URL": "http://y:2"}) == "http://x:1"


@pytest.mark.parametrize(
    ("environ", "local_rank", "gpu"),
    [
        ({}, 3, "3"),  # torchrun, every GPU visible: cuda:LOCAL_RANK
        ({}, None, None),  # nothing to go by
        ({"CUDA_VISIBLE_DEVICES": "3"}, 0, "3"),  # one GPU visible, whatever the local rank
        ({"CUDA_VISIBLE_DEVICES": "3"}, 5, "3"),
        ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 1, "5"),  # remapped: ordinal 1 is the node's GPU 5
        ({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, 1, "GPU-bb"),  # by UUID
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 2, None),  # an ordinal the process does not see
        ({"CUDA_VISIBLE_DEVICES": ""}, 0, None),  # no GPU at all
        ({"CUDA_VISIBLE_DEVICES": "MIG-1b2c3d4e-0000-5555-aaaa-0123456789ab"}, 3,
         "MIG-1b2c3d4e-0000-5555-aaaa-0123456789ab"),  # a MIG instance, by its UUID
        ({"CUDA_VISIBLE_DEVICES": "MIG-GPU-8f2d/1/0"}, 0, "MIG-GPU-8f2d/1/0"),  # the older MIG form
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-cc"}, 0, "GPU-cc"),  # a container given one GPU
        ({"NVIDIA_VISIBLE_DEVICES": "2,6"}, 1, "6"),  # the runtime renumbers them 0, 1
        ({"NVIDIA_VISIBLE_DEVICES": "2,6", "CUDA_VISIBLE_DEVICES": "1"}, 0, "6"),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, 4, "4"),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, 0, None),
        ({"SLURM_STEP_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1"}, 1, "5"),  # cgroup-constrained: renumbered
        ({"SLURM_STEP_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "4,5"}, 1, "5"),  # not constrained
        ({"SLURM_JOB_GPUS": "6", "CUDA_VISIBLE_DEVICES": "0"}, 0, "6"),
    ],
)
def test_node_gpu_names_the_gpu_as_the_node_does(
    environ: dict[str, str], local_rank: int | None, gpu: str | None
) -> None:
    assert node_gpu(environ, local_rank) == gpu


def test_the_device_the_model_is_on_wins_over_the_local_rank() -> None:
    assert node_gpu({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, local_rank=0, device=3) == "7"
    assert node_gpu({}, local_rank=0, device=2) == "2"


def test_process_start_time_reads_proc_stat(tmp_path: object) -> None:
    own = process_start_time()
    assert own is not None and own == process_start_time(os.getpid())
    proc = os.path.join(str(tmp_path), "41")
    os.makedirs(proc)
    with open(os.path.join(proc, "stat"), "w") as stat:  # a command name with spaces and parentheses
        stat.write("41 (a (b) c) S 1 41 41 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615")
    assert process_start_time(41, str(tmp_path)) == 987654
    assert process_start_time(42, str(tmp_path)) is None


def test_a_process_below_the_ranks_own_is_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = os.getpid() + 1  # another process: the one that started this one
    assert rank_reported_above("job:a", 3, {RANK_PROCESS_VAR: f"{parent}:3:job:a"}) == parent
    assert rank_reported_above("job:a", 4, {RANK_PROCESS_VAR: f"{parent}:3:job:a"}) is None  # another rank's worker
    assert rank_reported_above("job:b", 3, {RANK_PROCESS_VAR: f"{parent}:3:job:a"}) is None
    assert rank_reported_above("job:a", 3, {RANK_PROCESS_VAR: f"{os.getpid()}:3:job:a"}) is None  # this one
    assert rank_reported_above("job:a", 3, {RANK_PROCESS_VAR: "garbage"}) is None
    assert rank_reported_above("job:a", 3, {}) is None
    monkeypatch.delenv(RANK_PROCESS_VAR, raising=False)
    claim_rank("job:a", 3)
    assert os.environ[RANK_PROCESS_VAR] == f"{os.getpid()}:3:job:a"  # what the processes it starts inherit


def test_plain_torchrun_jobs_without_an_id_never_share_one() -> None:
    """Two torchrun jobs with no job id reported as training_job="unknown" and merged (#35 item 5)."""
    def job(rank: int, port: str) -> str:
        return detect(environ={"TORCHELASTIC_RUN_ID": "none", "RANK": str(rank), "MASTER_ADDR": "10.0.0.7",
                               "MASTER_PORT": port}).job
    assert job(0, "29500") == job(7, "29500")  # every rank of one job
    assert job(0, "29500") != job(0, "29501")  # two jobs at once cannot share a rendezvous port
    assert "unknown" not in {job(0, "29500"), job(0, "29501")}


def test_a_job_id_the_daemon_would_refuse_is_said_once_at_construction(caplog) -> None:
    import logging

    from fleetscope.client import StepTracker
    with caplog.at_level(logging.ERROR, logger="fleetscope"):
        tracker = StepTracker(job="j" * 129, rank=0, url="http://127.0.0.1:9", environ={}, flush_interval=0.01)
        with tracker.step():
            pass
        tracker.close(timeout=0.5)
    assert tracker.stats().error == "the job id is 129 characters; it must be 1 to 128"
    assert [r.getMessage() for r in caplog.records if "job id" in r.getMessage()] == [
        "fleetscope: the job id is 129 characters; it must be 1 to 128; this tracker sends nothing"]
