from __future__ import annotations

from fleetscope.client.placement import DEFAULT_URL, detect, push_url, visible_gpu


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
    assert (bare.job, bare.rank, bare.local_rank, bare.world_size) == ("unknown", 0, None, None)


def test_push_url() -> None:
    assert push_url(environ={}) == DEFAULT_URL == "http://127.0.0.1:9402"
    assert push_url(environ={"FLEETSCOPE_PUSH_URL": "http://10.0.0.5:9402/"}) == "http://10.0.0.5:9402"
    assert push_url("http://x:1", environ={"FLEETSCOPE_PUSH_URL": "http://y:2"}) == "http://x:1"


def test_visible_gpu_only_when_exactly_one() -> None:
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "3"}) == "3"
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == "GPU-abc"
    assert visible_gpu({"CUDA_VISIBLE_DEVICES": "0,1"}) is None
    assert visible_gpu({}) is None
