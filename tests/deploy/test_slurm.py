"""The Slurm scripts, run for real against stand-ins for `scontrol` and `fleetscope check`."""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetscope.collectors import REGISTRY
from fleetscope.config import load
from fleetscope.sources.fs import Root
from fleetscope.sources.gpu_jobs import prolog_jobs
from tests.deploy.manifests import REPO

SLURM = REPO / "deploy" / "slurm"


def write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@dataclass
class FakeNode:
    """A bin/ directory with a fake `scontrol` (node state from a file, calls logged) and `fleetscope`."""

    tmp: Path

    def __post_init__(self) -> None:
        self.bin = self.tmp / "bin"
        self.bin.mkdir()
        self.calls = self.tmp / "scontrol.calls"
        self.state = self.tmp / "node.state"
        write_executable(self.bin / "scontrol", (
            "#!/bin/bash\n"
            f'if [ "$1" = "-o" ] && [ "$2" = show ]; then cat "{self.state}"; exit 0; fi\n'
            f'printf "%s\\n" "$*" >> "{self.calls}"\n'
        ))
        # logger may be missing or log elsewhere; the scripts' messages are not under test.
        write_executable(self.bin / "logger", "#!/bin/sh\nexit 0\n")

    def set_node(self, state: str, reason: str = "") -> None:
        line = f"NodeName=gpu-st-1 Arch=x86_64 CoresPerSocket=48 State={state} Partitions=train"
        if reason:
            line += f" Reason={reason}"
        self.state.write_text(line + "\n")

    def set_check(self, exit_code: int, output: str = "", sleep: float = 0) -> None:
        write_executable(self.bin / "fleetscope", (
            "#!/bin/bash\n"
            f'[ "$1" = check ] || exit 99\n'
            f"sleep {sleep}\n"
            f"cat <<'OUT'\n{output}\nOUT\n"
            f"exit {exit_code}\n"
        ))

    def run_healthcheck(self, **env: str) -> list[str]:
        environment = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "FLEETSCOPE": str(self.bin / "fleetscope"),
            "FLEETSCOPE_CHECK_CONFIG": str(self.tmp / "absent.yaml"),
            "SLURMD_NODENAME": "gpu-st-1",
            **env,
        }
        result = subprocess.run(["bash", str(SLURM / "healthcheck.sh")], env=environment, capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        return self.calls.read_text().splitlines() if self.calls.exists() else []


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path)


UNHEALTHY = (
    "UNHEALTHY gpu: gpu 3: fell off the bus\nWARNING efa: rdmap79s0: retransmits\nUNHEALTHY efa: node: 3 of 4 devices"
)


def test_unhealthy_node_is_drained_with_a_fleetscope_reason(node: FakeNode) -> None:
    node.set_node("MIXED")
    node.set_check(1, UNHEALTHY)
    calls = node.run_healthcheck()
    expected = ("update NodeName=gpu-st-1 State=DRAIN Reason=fleetscope: gpu: gpu 3: fell off the bus; "
                "efa: node: 3 of 4 devices")
    assert calls == [expected]


def test_long_reasons_are_cut(node: FakeNode) -> None:
    node.set_node("IDLE")
    node.set_check(
        1, "\n".join(f"UNHEALTHY gpu: gpu {i}: uncorrectable ECC errors pending row remap" for i in range(8))
    )
    (call,) = node.run_healthcheck()
    reason = call.split("Reason=", 1)[1]
    assert reason.startswith("fleetscope: gpu: gpu 0:") and len(reason) == 200


def test_no_control_character_reaches_scontrol(node: FakeNode) -> None:
    node.set_node("IDLE")
    node.set_check(1, "UNHEALTHY gpu: gpu 3: fell\x1b[2J off\x07 the bus\r")
    (call,) = node.run_healthcheck()
    assert call == "update NodeName=gpu-st-1 State=DRAIN Reason=fleetscope: gpu: gpu 3: fell [2J off  the bus "


def test_operator_drain_is_left_alone(node: FakeNode) -> None:
    node.set_node("IDLE+DRAIN", "replacing NIC [admin@2026-11-20T10:00:00]")
    node.set_check(1, UNHEALTHY)
    assert node.run_healthcheck() == []
    node.set_check(0, "HEALTHY")
    assert node.run_healthcheck() == [], "a healthy node must not be resumed from someone else's drain"


def test_healthy_node_drained_by_fleetscope_is_resumed(node: FakeNode) -> None:
    node.set_node("IDLE+DRAIN", "fleetscope: gpu: gpu 3: fell off the bus [root@2026-11-21T08:00:00]")
    node.set_check(0, "HEALTHY")
    assert node.run_healthcheck() == ["update NodeName=gpu-st-1 State=RESUME"]


def test_still_unhealthy_node_keeps_its_drain(node: FakeNode) -> None:
    node.set_node("DRAINED", "fleetscope: gpu: gpu 3: fell off the bus [root@2026-11-21T08:00:00]")
    node.set_check(1, UNHEALTHY)
    assert node.run_healthcheck() == []


def test_healthy_undrained_node_is_not_touched(node: FakeNode) -> None:
    node.set_node("ALLOCATED")
    node.set_check(0, "HEALTHY")
    assert node.run_healthcheck() == []


@pytest.mark.parametrize("exit_code", [2, 3, 127])
def test_unknown_health_changes_nothing(node: FakeNode, exit_code: int) -> None:
    node.set_node("IDLE+DRAIN", "fleetscope: efa: node: 3 of 4 devices")
    node.set_check(exit_code, "UNKNOWN gpu: collector: no answer within 20s")
    assert node.run_healthcheck() == []
    node.set_node("IDLE")
    assert node.run_healthcheck() == []


def test_hanging_check_counts_as_unknown(node: FakeNode) -> None:
    node.set_node("IDLE")
    node.set_check(1, UNHEALTHY, sleep=30)
    assert node.run_healthcheck(FLEETSCOPE_CHECK_TIMEOUT="1") == []


def test_unreachable_controller_changes_nothing(node: FakeNode) -> None:
    node.state.write_text("")
    node.set_check(1, UNHEALTHY)
    assert node.run_healthcheck() == []


# -- prolog / epilog ----------------------------------------------------------------------------


def run_script(name: str, jobs_dir: Path, **env: str) -> None:
    environment = {"PATH": os.environ["PATH"], "FLEETSCOPE_JOBS_DIR": str(jobs_dir), **env}
    result = subprocess.run(
        ["bash", str(SLURM / name)], env=environment, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr


def records(jobs_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(jobs_dir.iterdir())} if jobs_dir.exists() else {}


def test_prolog_records_the_jobs_gpus_for_the_daemon(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    run_script("prolog.sh", jobs, SLURM_JOB_ID="4242", SLURM_JOB_UID="1001", SLURM_JOB_GPUS="0,3,07")
    assert records(jobs) == {"0": "4242 1001\n", "3": "4242 1001\n", "7": "4242 1001\n"}
    # The daemon's own reader sees the same assignment.
    uuids = {i: f"GPU-{i}" for i in range(8)}
    assert prolog_jobs(Root(str(jobs)), uuids) == {0: "4242", 3: "4242", 7: "4242"}


def test_prolog_falls_back_to_cuda_visible_devices_and_skips_uuids(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    run_script("prolog.sh", jobs, SLURM_JOB_ID="7", SLURM_JOB_UID="0", CUDA_VISIBLE_DEVICES="2, 5,GPU-1f2e")
    assert records(jobs) == {"2": "7 0\n", "5": "7 0\n"}


def test_prolog_without_gpus_or_job_id_writes_nothing_and_succeeds(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    run_script("prolog.sh", jobs, SLURM_JOB_ID="8", SLURM_JOB_UID="0")
    run_script("prolog.sh", jobs, SLURM_JOB_ID="../../etc/passwd", SLURM_JOB_GPUS="0")
    assert records(jobs) == {}


def test_prolog_never_fails_the_job_when_it_cannot_write(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    run_script("prolog.sh", blocker / "jobs", SLURM_JOB_ID="9", SLURM_JOB_GPUS="0")


def test_epilog_removes_only_the_finished_jobs_records(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    run_script("prolog.sh", jobs, SLURM_JOB_ID="100", SLURM_JOB_UID="1001", SLURM_JOB_GPUS="0,1")
    run_script("prolog.sh", jobs, SLURM_JOB_ID="101", SLURM_JOB_UID="1002", SLURM_JOB_GPUS="1,2")
    run_script("epilog.sh", jobs, SLURM_JOB_ID="100")
    assert records(jobs) == {"1": "101 1002\n", "2": "101 1002\n"}
    run_script("epilog.sh", jobs, SLURM_JOB_ID="101")
    assert records(jobs) == {}
    run_script("epilog.sh", tmp_path / "missing", SLURM_JOB_ID="5")


def test_prolog_writes_where_the_daemon_reads_by_default() -> None:
    defaults = load(environ={}, registry=REGISTRY)
    script = (SLURM / "prolog.sh").read_text()
    assert f'FLEETSCOPE_JOBS_DIR:-{defaults.gpu.jobs_dir}}}' in script


def test_task_prolog_points_tasks_at_the_local_daemon(tmp_path: Path) -> None:
    def run(**env: str) -> str:
        return subprocess.run(["bash", str(SLURM / "task-prolog.sh")], env={"PATH": os.environ["PATH"], **env},
                              capture_output=True, text=True, timeout=30, check=True).stdout

    shipped = load(environ={}, yaml_path=str(SLURM.parent / "systemd" / "config.yaml"))
    host, _, port = shipped.push.listen_address.rpartition(":")
    assert host == "127.0.0.1"  # pushes on loopback only (#35): the ranks are local
    assert run() == f"export FLEETSCOPE_PUSH_URL=http://127.0.0.1:{port}\n"
    assert run(FLEETSCOPE_PUSH_URL="http://10.0.0.5:9402") == ""


def test_task_prolog_enables_the_nccl_inspector_when_the_plugin_is_installed(tmp_path: Path) -> None:
    def run(**env: str) -> list[str]:
        out = subprocess.run(["bash", str(SLURM / "task-prolog.sh")],
                             env={"PATH": os.environ["PATH"], "FLEETSCOPE_PUSH_URL": "x", **env},
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return out.splitlines()

    plugin = tmp_path / "libnccl-profiler-inspector.so"
    assert run(SLURM_JOB_ID="81234", FLEETSCOPE_NCCL_INSPECTOR_PLUGIN=str(plugin)) == []  # not installed
    plugin.write_bytes(b"\x7fELF")
    lines = run(SLURM_JOB_ID="81234", FLEETSCOPE_NCCL_INSPECTOR_PLUGIN=str(plugin))
    env = dict(line.removeprefix("export ").split("=", 1) for line in lines)
    assert env == {
        "NCCL_PROFILER_PLUGIN": str(plugin), "NCCL_INSPECTOR_ENABLE": "1",
        "NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS": "1000000",
        # One directory per job under the daemon's nccl.dir (it reads one level of subdirectories).
        "NCCL_INSPECTOR_DUMP_DIR": f"{load(environ={}).nccl.dir}/81234",
    }
    # A job that brings its own plugin keeps it.
    assert run(SLURM_JOB_ID="81234", FLEETSCOPE_NCCL_INSPECTOR_PLUGIN=str(plugin), NCCL_PROFILER_PLUGIN="/x.so") == []
