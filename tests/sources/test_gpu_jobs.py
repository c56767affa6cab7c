from __future__ import annotations

import os
from dataclasses import asdict

import pytest

from fleetscope.sources.fs import Root
from fleetscope.sources.gpu_jobs import JobAttribution, attribute, parse_cgroup, parse_environ
from tests.sources.unprivileged import as_reader, needs_root, public_directory, trainer_process

POD_UID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
CONTAINER = "a" * 64


@pytest.mark.parametrize("text, expected", [
    # Slurm, cgroup v1 (several hierarchies)
    ("12:memory:/slurm/uid_1000/job_4242/step_0/task_0\n11:devices:/slurm/uid_1000/job_4242/step_0\n",
     ("4242", "", "")),
    # Slurm, cgroup v2 up to 25.11
    ("0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_0\n", ("777", "", "")),
    ("0::/system.slice/slurmstepd.scope/job_777/step_batch/user/task_special\n", ("777", "", "")),
    # --enable-multiple-slurmd prefixes the node name
    ("0::/system.slice/node7_slurmstepd.scope/job_778/step_extern/user/task_0\n", ("778", "", "")),
    # Slurm 26.05+: the SLUID names the job's cgroup
    ("0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_0\n", ("s5K1KKYAYG5D00", "", "")),
    # slurmstepd's own processes are no job
    ("0::/system.slice/slurmstepd.scope/system\n", ("", "", "")),
    # Kubernetes, systemd driver (underscores in the UID)
    ((f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/"
      f"cri-containerd-{CONTAINER}.scope\n"), ("", POD_UID, CONTAINER)),
    # Kubernetes, cgroupfs driver
    (f"0::/kubepods/besteffort/pod{POD_UID}/{CONTAINER}\n", ("", POD_UID, CONTAINER)),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", ("", "", "")),
    ("", ("", "", "")),
])
def test_cgroup_paths(text: str, expected: tuple[str, str, str]) -> None:
    job = parse_cgroup(text)
    assert (job.slurm_job_id, job.pod_uid, job.container) == expected


def test_environ_keeps_only_job_variables() -> None:
    env = parse_environ("PATH=/bin\0RANK=3\0LOCAL_RANK=3\0SLURM_JOB_ID=99\0SECRET=x\0BROKEN\0")
    assert env == {"RANK": "3", "LOCAL_RANK": "3", "SLURM_JOB_ID": "99"}


def test_a_value_longer_than_a_job_id_is_no_label() -> None:
    """A process's environment becomes labels: one 100 kB FLEETSCOPE_JOB would be a 100 kB label (#30)."""
    env = parse_environ("FLEETSCOPE_JOB=" + "j" * 100_000 + "\0RANK=3\0SLURM_JOB_ID=" + "9" * 128 + "\0")
    assert env == {"RANK": "3", "SLURM_JOB_ID": "9" * 128}


def make_proc(root: str, pid: int, cgroup: str, environ: dict[str, str] | None) -> None:
    path = os.path.join(root, str(pid))
    os.makedirs(path)
    with open(os.path.join(path, "cgroup"), "w") as handle:
        handle.write(cgroup)
    if environ is not None:
        with open(os.path.join(path, "environ"), "w") as handle:
            handle.write("\0".join(f"{k}={v}" for k, v in environ.items()) + "\0")


def test_attribution_per_gpu(tmp_path) -> None:
    proc, jobs = str(tmp_path / "proc"), str(tmp_path / "jobs")
    os.makedirs(jobs)
    make_proc(proc, 101, "0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_0\n",
              {"FLEETSCOPE_JOB": "llama-70b", "RANK": "8", "LOCAL_RANK": "0"})
    make_proc(proc, 102, "0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_1\n",
              {"SLURM_PROCID": "9", "SLURM_LOCALID": "1"})
    make_proc(proc, 103, f"0::/kubepods/burstable/pod{POD_UID}/{CONTAINER}\n",
              {"TORCHELASTIC_RUN_ID": "none", "RANK": "2", "LOCAL_RANK": "2"})
    make_proc(proc, 104, "0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_0\n", None)  # environ unreadable
    make_proc(proc, 105, "0::/user.slice\n", {"PATH": "/bin"})  # no job at all
    with open(os.path.join(jobs, "GPU-5"), "w") as handle:
        handle.write("888 1000\n")
    with open(os.path.join(jobs, "3"), "w") as handle:
        handle.write("999\n")
    result = attribute(Root(proc), Root(jobs), {0: [101, 101], 1: [102], 2: [103], 3: [104], 4: [105, 999], 5: []},
                       {0: "GPU-0", 1: "GPU-1", 2: "GPU-2", 3: "GPU-3", 4: "GPU-4", 5: "GPU-5"})
    assert result[0] == (JobAttribution("llama-70b", "8", "0", "777", "", ""),)  # one series for a repeated pid
    assert result[1] == (JobAttribution("777", "9", "1", "777", "", ""),)
    assert result[2] == (JobAttribution(POD_UID, "2", "2", "", POD_UID, CONTAINER),)
    assert result[3] == (JobAttribution("777", "", "", "777", "", ""),)  # cgroup wins over the prolog record
    assert 4 not in result  # nothing to say: no series
    assert result[5] == (JobAttribution("888", "", "", "888", "", ""),)  # prolog record named by UUID


# -- the DaemonSet's reader: root with every capability dropped (#30 item 7) ----------------------------

# What a daemon in its own cgroup namespace (containerd's default on cgroup v2) reads for a pod's process.
POD_CGROUP = (f"0::/../../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID.replace('-', '_')}"
              f".slice/cri-containerd-{CONTAINER}.scope\n")


@needs_root
@pytest.mark.parametrize("who", ["root-drop-all", "nobody"])
def test_a_pods_gpu_process_is_attributed_without_any_capability(who: str) -> None:
    """Another user's /proc/<pid>/environ needs CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (measured, kernel 6.18):
    without them the job comes from the world-readable cgroup, the pod's UID and container; the rank from the
    rank's own pushes (rank_info's gpu)."""
    environ = {"FLEETSCOPE_JOB": "llm", "RANK": "5", "LOCAL_RANK": "5"}
    with trainer_process(environ) as trainer, public_directory() as root:
        proc = os.path.join(root, "proc", str(trainer.pid))
        os.makedirs(proc)
        for name in ("environ", "status"):  # the real process's files, with their real permissions
            os.symlink(f"/proc/{trainer.pid}/{name}", os.path.join(proc, name))
        with open(os.path.join(proc, "cgroup"), "w") as handle:  # this machine runs no pods
            handle.write(POD_CGROUP)
        procfs, jobs = Root(os.path.join(root, "proc")), Root(os.path.join(root, "jobs"))

        def read() -> tuple[str, list[dict[str, str]]]:
            try:
                with open(os.path.join(proc, "environ"), "rb"):
                    readable = "read"
            except PermissionError:
                readable = "EACCES"
            return readable, [asdict(job) for job in attribute(procfs, jobs, {0: [trainer.pid]}, {0: "GPU-0"})[0]]

        privileged = read()  # the systemd unit's daemon (root, CAP_SYS_PTRACE) reads the environment
        unprivileged = as_reader(who, read)
    assert privileged == ("read", [asdict(JobAttribution("llm", "5", "5", "", POD_UID, CONTAINER))])
    assert unprivileged == ["EACCES", [asdict(JobAttribution(POD_UID, "", "", "", POD_UID, CONTAINER))]]
