"""Which job uses which GPU: from the GPU's processes (NVML pids) to Slurm jobs and Kubernetes pods.

For each pid on a GPU (host PID namespace: a containerised daemon needs
``hostPID``), ``/proc/<pid>/cgroup`` and, when readable (root or same uid),
``/proc/<pid>/environ`` give:

* the Slurm job: ``SLURM_JOB_ID`` in the environment, else the cgroup path —
  v1 ``/slurm/uid_<uid>/job_<id>/step_<n>``, v2 up to 25.11
  ``/system.slice/slurmstepd.scope/job_<id>/step_<n>/...``, v2 from 26.05
  ``.../slurmstepd.scope/<SLUID>/step_<n>/...`` (unless ``CgroupJobIdPaths=yes``),
  with an optional ``<node>_`` prefix on the scope (``--enable-multiple-slurmd``);
* the Kubernetes pod UID (``pod<uid>``, with ``_`` for ``-`` under the systemd
  driver) and the container id (``cri-containerd-<id>.scope``, ``docker-``,
  ``crio-``, or a bare 64-hex last component);
* ``RANK`` / ``LOCAL_RANK`` (else ``SLURM_PROCID`` / ``SLURM_LOCALID``).

Slurm prolog records: a file per GPU in ``--gpu.jobs-dir`` named by the GPU
index (or UUID) whose first word is the job id (the jobstats convention,
``<jobid> <uid>``), so a GPU is attributed even before its process appears.

``training_job`` is the id the job's pushed training metrics carry:
``FLEETSCOPE_JOB``, else the Slurm job id, else ``TORCHELASTIC_RUN_ID``, else
the pod UID. One series per (GPU, job, rank): no per-pid labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fleetscope.sources.fs import Root, Unreadable

SLURM_V1_RE = re.compile(r"/slurm/uid_\d+/job_(?P<job>\d+)(?:/|$)")
SLURM_V2_RE = re.compile(r"/(?:[^/]+_)?slurmstepd\.scope/(?P<unit>[^/]+)")
SLURM_JOB_UNIT_RE = re.compile(r"^job_(?P<job>\d+)$")
SLUID_RE = re.compile(r"^[A-Za-z0-9]{6,}$")
POD_RE = re.compile(
    r"pod(?P<uid>[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)
CONTAINER_RE = re.compile(r"^(?:cri-containerd-|docker-|crio-|containerd-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")
# A value longer than a pushed job id may be (fleetscope.wire.MAX_ID_LENGTH) is no job id or rank: it would
# only make labels as long as a process cares to make them.
MAX_VALUE_CHARS = 128
ENV_KEYS = ("FLEETSCOPE_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "SLURM_PROCID",
            "SLURM_LOCALID")


@dataclass(frozen=True)
class CgroupJob:
    slurm_job_id: str = ""
    pod_uid: str = ""
    container: str = ""


@dataclass(frozen=True)
class JobAttribution:
    training_job: str = ""
    rank: str = ""
    local_rank: str = ""
    slurm_job_id: str = ""
    pod_uid: str = ""
    container: str = ""


def parse_cgroup(text: str) -> CgroupJob:
    """Slurm job and Kubernetes pod/container from the lines of ``/proc/<pid>/cgroup`` (v1 or v2)."""
    slurm = pod = container = ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        if not path:
            continue
        v1 = SLURM_V1_RE.search(path)
        if v1 and not slurm:
            slurm = v1.group("job")
        v2 = SLURM_V2_RE.search(path)
        if v2 and not slurm:
            unit = v2.group("unit")
            job = SLURM_JOB_UNIT_RE.match(unit)
            if job:
                slurm = job.group("job")
            elif unit != "system" and SLUID_RE.match(unit):
                slurm = unit  # Slurm 26.05+: the job's SLUID names its cgroup
        pod_match = POD_RE.search(path)
        if pod_match and not pod:
            pod = pod_match.group("uid").replace("_", "-").lower()
            last = path.rstrip("/").rsplit("/", 1)[-1]
            container_match = CONTAINER_RE.match(last)
            if container_match:
                container = container_match.group("id")
    return CgroupJob(slurm, pod, container)


def parse_environ(data: str) -> dict[str, str]:
    """The job-relevant variables of a NUL-separated ``/proc/<pid>/environ``."""
    out: dict[str, str] = {}
    for item in data.split("\0"):
        key, sep, value = item.partition("=")
        if sep and key in ENV_KEYS and len(value) <= MAX_VALUE_CHARS:
            out[key] = value
    return out


def attribute_process(procfs: Root, pid: int) -> JobAttribution | None:
    """The job of one process; None if neither its cgroup nor its environment names one."""
    try:
        cgroup = parse_cgroup(procfs.read_file(str(pid), "cgroup"))
    except Unreadable:
        cgroup = CgroupJob()
    try:
        env = parse_environ(procfs.read_file(str(pid), "environ"))
    except Unreadable:
        env = {}  # another user's process: only root (PTRACE_MODE_READ) may read it
    slurm = env.get("SLURM_JOB_ID") or cgroup.slurm_job_id
    elastic = env.get("TORCHELASTIC_RUN_ID", "")
    elastic_job = elastic if elastic not in ("", "none") else ""
    training_job = env.get("FLEETSCOPE_JOB") or slurm or elastic_job or cgroup.pod_uid
    attribution = JobAttribution(
        training_job=training_job,
        rank=env.get("RANK", env.get("SLURM_PROCID", "")),
        local_rank=env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "")),
        slurm_job_id=slurm, pod_uid=cgroup.pod_uid, container=cgroup.container,
    )
    return attribution if attribution != JobAttribution() else None


def prolog_jobs(jobs_dir: Root, gpus: Mapping[int, str]) -> dict[int, str]:
    """GPU index -> Slurm job id from prolog records named by index or UUID."""
    out: dict[int, str] = {}
    for index, uuid in gpus.items():
        for name in (str(index), uuid):
            if not name:
                continue
            try:
                words = jobs_dir.read_file(name).split()
            except Unreadable:
                continue
            if words:
                out[index] = words[0]
                break
    return out


def attribute(
    procfs: Root, jobs_dir: Root, gpu_pids: Mapping[int, Iterable[int]], gpu_uuids: Mapping[int, str],
) -> dict[int, tuple[JobAttribution, ...]]:
    """GPU index -> its distinct jobs, from its processes and, failing those, the prolog record."""
    records = prolog_jobs(jobs_dir, gpu_uuids)
    out: dict[int, tuple[JobAttribution, ...]] = {}
    for index in sorted(set(gpu_pids) | set(records)):
        found = dict.fromkeys(attribute_pids(procfs, gpu_pids.get(index, ())))
        if not found and index in records:
            found[JobAttribution(training_job=records[index], slurm_job_id=records[index])] = None
        if found:
            out[index] = tuple(found)
    return out


def attribute_pids(procfs: Root, pids: Iterable[int]) -> tuple[JobAttribution, ...]:
    """The distinct jobs of some processes (a GPU's, or a MIG GPU instance's), in the order first seen."""
    found: dict[JobAttribution, None] = {}
    for pid in pids:
        job = attribute_process(procfs, pid)
        if job is not None:
            found[job] = None
    return tuple(found)
