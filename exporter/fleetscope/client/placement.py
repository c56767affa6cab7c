"""Who is pushing: job id, rank, local rank and GPU from arguments or the launcher's environment.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE and TORCHELASTIC_RUN_ID (the
rendezvous id, ``none`` when not given); Slurm sets SLURM_JOB_ID,
SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS. Under ``srun torchrun`` both
are present and torchrun's per-process values win for ranks, while the Slurm
job id wins for the job (it is the id the rest of the cluster knows).

The GPU is named the way the node's daemon names it, so a rank's series join
its GPU's (``gpu`` label: the node's device index, or a UUID when that is all
the process can know). See :func:`node_gpu`.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetscope.wire import MAX_ID_LENGTH, process_start_time

DEFAULT_URL = "http://127.0.0.1:9402"
# Set by the process that reports for a rank; inherited by the processes it starts (DataLoader workers).
RANK_PROCESS_VAR = "FLEETSCOPE_RANK_PROCESS"
__all__ = [
    "DEFAULT_URL", "RANK_PROCESS_VAR", "Placement", "claim_rank", "detect", "fallback_job", "job_id_problem",
    "node_gpu", "process_start_time", "push_url", "rank_lease", "rank_reported_above",
]


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
            or fallback_job(env)
        )
    if rank is None:
        rank = _int(env, "RANK", "SLURM_PROCID") or 0
    if local_rank is None:
        local_rank = _int(env, "LOCAL_RANK", "SLURM_LOCALID")
    if world_size is None:
        world_size = _int(env, "WORLD_SIZE", "SLURM_NTASKS")
    return Placement(job, rank, local_rank, world_size)


def fallback_job(environ: Mapping[str, str]) -> str:
    """A job id when nothing names the job: the same on every rank of one job, never one two jobs share.

    Under torchrun without a rendezvous id every rank of a job meets at the same ``MASTER_ADDR:MASTER_PORT``,
    which no two running jobs can share; a process started any other way is a job of its own (its host, pid
    and start time). Before, both were ``unknown``, and two such jobs merged into one series (#35 item 5).
    """
    addr, port = environ.get("MASTER_ADDR", "").strip(), environ.get("MASTER_PORT", "").strip()
    if addr and port:
        return f"torchrun-{addr}-{port}"[:MAX_ID_LENGTH]
    return f"{socket.gethostname()}-{os.getpid()}-{process_start_time()}"[:MAX_ID_LENGTH]


def job_id_problem(job: str) -> str:
    """Why the daemon would refuse this job id ("" when it would not)."""
    if not job or len(job) > MAX_ID_LENGTH:
        return f"the job id is {len(job)} characters; it must be 1 to {MAX_ID_LENGTH}"
    if re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029]", job):
        return "the job id has a control character"
    return ""


_LEASES: dict[tuple[str, int], str] = {}
_LEASES_LOCK = threading.Lock()


def rank_lease(job: str, rank: int) -> str:
    """This process's lease on ``(job, rank)``: a random secret, the same for every tracker of the process.

    The daemon keeps the first lease a rank reports and, while that process lives, refuses steps, phases and
    job ends for the rank without it (#35 item 5). Never printed, never exported.
    """
    with _LEASES_LOCK:
        return _LEASES.setdefault((job, rank), secrets.token_hex(16))


def push_url(url: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return (url or env.get("FLEETSCOPE_PUSH_URL") or DEFAULT_URL).rstrip("/")


def _devices(text: str | None) -> list[str] | None:
    """A device list variable: None when unset (no restriction), [] when it hides every device."""
    if text is None:
        return None
    text = text.strip()
    if text.lower() in ("all", ""):
        return None if text.lower() == "all" else []
    if text.lower() in ("none", "void"):
        return []
    return [d.strip() for d in text.split(",") if d.strip()]


def _pick(devices: Sequence[str], ordinal: int) -> str | None:
    return devices[ordinal] if 0 <= ordinal < len(devices) else None


def node_gpu(
    environ: Mapping[str, str] | None = None, local_rank: int | None = None, device: int | None = None
) -> str | None:
    """The node's name for the GPU this process computes on, or None when it cannot tell.

    ``device`` is the CUDA ordinal the process uses (``torch.cuda.current_device()``); by the
    torchrun convention it is ``LOCAL_RANK`` when the process sees several GPUs, else 0. The
    ordinal indexes ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-``/``MIG-`` UUIDs), which itself
    indexes what the container or the Slurm step was given: ``NVIDIA_VISIBLE_DEVICES`` (the NVIDIA
    container runtime renumbers the GPUs it exposes from 0) or ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``
    (with cgroup-constrained devices Slurm also renumbers from 0). A MIG instance is named by its UUID:
    a process computes on one MIG instance, the first it sees.
    """
    env = os.environ if environ is None else environ
    cuda = _devices(env.get("CUDA_VISIBLE_DEVICES"))
    given = _devices(env.get("NVIDIA_VISIBLE_DEVICES"))
    if given is None:
        given = _devices(env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"))
    if cuda == [] or given == []:
        return None  # this process sees no GPU
    visible = cuda if cuda is not None else given
    if visible is not None and any(d.startswith("MIG-") for d in visible):
        return visible[0]
    if device is None:
        if visible is not None and len(visible) == 1:
            device = 0
        elif local_rank is not None:
            device = local_rank
        else:
            return None
    if cuda is None:
        return _pick(given, device) if given is not None else str(device)
    entry = _pick(cuda, device)
    if entry is None or not entry.isdigit() or given is None or cuda == given:
        return entry
    # CUDA_VISIBLE_DEVICES counts within what the container or the Slurm step was given.
    return _pick(given, int(entry))


def rank_reported_above(job: str, rank: int, environ: Mapping[str, str] | None = None) -> int | None:
    """The pid of the process above this one that already reports for ``(job, rank)``, if any.

    A ``DataLoader`` worker started with ``spawn`` or ``forkserver`` (the forkserver itself too) imports the
    training script again, so a tracker created at module level is created in it for the same rank. The
    rank's own process said who it is in :data:`RANK_PROCESS_VAR` (:func:`claim_rank`), which every process it
    starts inherits: a tracker that finds another process there for its own job and rank is not the rank's.
    """
    env = os.environ if environ is None else environ
    pid, _, rest = env.get(RANK_PROCESS_VAR, "").partition(":")
    rank_text, _, claimed_job = rest.partition(":")
    if pid.isdigit() and int(pid) != os.getpid() and rank_text == str(rank) and claimed_job == job:
        return int(pid)
    return None


def claim_rank(job: str, rank: int) -> None:
    """Say in this process's environment that it reports for ``(job, rank)`` (see :func:`rank_reported_above`)."""
    os.environ[RANK_PROCESS_VAR] = f"{os.getpid()}:{rank}:{job}"
