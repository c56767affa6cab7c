"""Who is pushing: job id, rank and local rank from arguments or the launcher's environment.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE and TORCHELASTIC_RUN_ID (the
rendezvous id, ``none`` when not given); Slurm sets SLURM_JOB_ID,
SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS. Under ``srun torchrun`` both
are present and torchrun's per-process values win for ranks, while the Slurm
job id wins for the job (it is the id the rest of the cluster knows).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_URL = "http://127.0.0.1:9402"


@dataclass(frozen=True)
class Placement:
    job: str
    rank: int
    local_rank: int | None
    world_size: int | None


def _int(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        text = environ.get(name, "").strip()
        if text.isdigit():
            return int(text)
    return None


def detect(
    job: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Placement:
    """Arguments first, then FLEETSCOPE_JOB / torchrun / Slurm variables, then defaults (rank 0)."""
    env = os.environ if environ is None else environ
    if job is None:
        run_id = env.get("TORCHELASTIC_RUN_ID", "")
        job = (
            env.get("FLEETSCOPE_JOB")
            or env.get("SLURM_JOB_ID")
            or (run_id if run_id and run_id != "none" else "")
            or "unknown"
        )
    if rank is None:
        rank = _int(env, "RANK", "SLURM_PROCID") or 0
    if local_rank is None:
        local_rank = _int(env, "LOCAL_RANK", "SLURM_LOCALID")
    if world_size is None:
        world_size = _int(env, "WORLD_SIZE", "SLURM_NTASKS")
    return Placement(job, rank, local_rank, world_size)


def push_url(url: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return (url or env.get("FLEETSCOPE_PUSH_URL") or DEFAULT_URL).rstrip("/")


def visible_gpu(environ: Mapping[str, str] | None = None) -> str | None:
    """The GPU of a process that sees exactly one (CUDA_VISIBLE_DEVICES=3 or =GPU-uuid)."""
    env = os.environ if environ is None else environ
    devices = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return devices[0] if len(devices) == 1 else None
