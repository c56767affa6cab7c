"""Slurm sites that already run NHC, and ParallelCluster: the NHC check function and the OnNodeConfigured action.

Both run for real under bash, against a stand-in `fleetscope` (its exit code and output chosen per test) and,
for NHC, the two functions NHC gives a check (`die` to fail the node with a reason, `log`).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from fleetscope.config import load
from tests.conftest import require_binary
from tests.deploy.manifests import REPO

SLURM = REPO / "deploy" / "slurm"
NHC = SLURM / "nhc" / "fleetscope.nhc"
ON_NODE_CONFIGURED = SLURM / "parallelcluster" / "on-node-configured.sh"
# NHC's own die() and log(), reduced to what a check function sees of them.
NHC_HARNESS = """
die() { printf 'DIE %s %s\\n' "$1" "$2"; return "$1"; }
log() { printf 'LOG %s\\n' "$*"; }
source "$NHC_FILE"
check_fleetscope "$@"
printf 'RC %s\\n' "$?"
"""


def write_executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def fake_fleetscope(tmp: Path, exit_code: int, output: str = "", sleep: float = 0) -> Path:
    binary = tmp / "bin" / "fleetscope"
    write_executable(binary, (
        "#!/bin/bash\n"
        f'printf "%s\\n" "$*" >> "{tmp / "fleetscope.calls"}"\n'
        '[ "$1" = check ] || exit 99\n'
        f"sleep {sleep}\n"
        f"cat <<'OUT'\n{output}\nOUT\n"
        f"exit {exit_code}\n"
    ))
    return binary


def run_check(tmp: Path, *args: str) -> list[str]:
    result = subprocess.run(["bash", "-c", NHC_HARNESS, "nhc", *args],
                            env={**os.environ, "NHC_FILE": str(NHC)}, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_nhc_check_passes_shellcheck() -> None:
    shellcheck = require_binary("shellcheck")
    result = subprocess.run([shellcheck, "--severity=style", "--shell=bash", str(NHC)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout


def test_nhc_healthy_node_passes(tmp_path: Path) -> None:
    binary = fake_fleetscope(tmp_path, 0, "HEALTHY gpu: 8 GPUs")
    assert run_check(tmp_path, "-b", str(binary), "-c", str(tmp_path / "absent.yaml")) == ["RC 0"]
    assert (tmp_path / "fleetscope.calls").read_text() == "check\n"  # no --config for a file that is not there


def test_nhc_unhealthy_node_fails_with_the_findings(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("gpu:\n  expected-count: 8\n")
    binary = fake_fleetscope(tmp_path, 1, "UNHEALTHY gpu: gpu 3: fell off the bus\nHEALTHY efa: 32 devices\n"
                                          "UNHEALTHY gpu: 7 GPUs found, 8 expected")
    lines = run_check(tmp_path, "-b", str(binary), "-c", str(config))
    assert lines == ["DIE 1 fleetscope: gpu: gpu 3: fell off the bus; gpu: 7 GPUs found, 8 expected", "RC 1"]
    assert (tmp_path / "fleetscope.calls").read_text() == f"check --config {config}\n"


def test_nhc_reason_is_cut_for_sinfo(tmp_path: Path) -> None:
    binary = fake_fleetscope(tmp_path, 1, "\n".join(f"UNHEALTHY gpu: gpu {i}: Xid 79" for i in range(40)))
    (die, rc) = run_check(tmp_path, "-b", str(binary))
    assert die.startswith("DIE 1 fleetscope: gpu: gpu 0: Xid 79; ") and len(die) == len("DIE 1 ") + 200
    assert rc == "RC 1"


@pytest.mark.parametrize("exit_code", [2, 3, 127])
def test_nhc_unknown_health_passes_and_logs(tmp_path: Path, exit_code: int) -> None:
    binary = fake_fleetscope(tmp_path, exit_code, "UNKNOWN training: Prometheus unreachable")
    log, rc = run_check(tmp_path, "-b", str(binary))
    assert log.startswith("LOG check_fleetscope: health unknown") and f"exit {exit_code}" in log
    assert rc == "RC 0"


def test_nhc_hanging_check_is_unknown_not_a_failure(tmp_path: Path) -> None:
    binary = fake_fleetscope(tmp_path, 1, "UNHEALTHY gpu: too late", sleep=30)
    log, rc = run_check(tmp_path, "-b", str(binary), "-t", "1")
    assert "exit 124" in log and rc == "RC 0"


def test_nhc_missing_binary_is_unknown(tmp_path: Path) -> None:
    log, rc = run_check(tmp_path, "-b", str(tmp_path / "nowhere" / "fleetscope"))
    assert "not installed" in log and rc == "RC 0"


def test_nhc_conditions_run_one_check_each(tmp_path: Path) -> None:
    binary = fake_fleetscope(tmp_path, 1, "2 of 32 EFA ports not ACTIVE")
    lines = run_check(tmp_path, "-b", str(binary), "-C", "gpu", "-C", "efa")
    assert lines == ["DIE 1 fleetscope: gpu: 2 of 32 EFA ports not ACTIVE; efa: 2 of 32 EFA ports not ACTIVE",
                     "RC 1"]
    assert (tmp_path / "fleetscope.calls").read_text() == "check --condition=gpu\ncheck --condition=efa\n"
    bad = run_check(tmp_path, "-b", str(binary), "-C", "disk")
    assert bad[0].startswith("DIE 1 check_fleetscope: unknown condition disk") and bad[-1] == "RC 1"


def source_tree(tmp: Path) -> Path:
    """A release tree whose install.sh records its arguments and lays out the config as the real one does."""
    tree = tmp / "src"
    (tree / "deploy" / "slurm" / "nhc").mkdir(parents=True)
    shutil.copy(NHC, tree / "deploy" / "slurm" / "nhc")
    shutil.copytree(REPO / "deploy" / "systemd", tree / "deploy" / "systemd")
    write_executable(tree / "deploy" / "systemd" / "install.sh", (
        "#!/bin/bash\n"
        f'printf "%s\\n" "$*" >> "{tmp / "install.calls"}"\n'
        'root=""; while [ $# -gt 0 ]; do [ "$1" = --root ] && root="$2"; shift; done\n'
        'install -d "$root/etc/fleetscope"\n'
        '[ -e "$root/etc/fleetscope/config.yaml" ] || '
        'install -m 0600 "$(dirname "$0")/config.yaml" "$root/etc/fleetscope/config.yaml"\n'
    ))
    return tree


def run_on_node_configured(
    tmp: Path, *args: str, instance_type: str = "p5.48xlarge"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ON_NODE_CONFIGURED), "--source", str(tmp / "src"), "--root", str(tmp / "root"),
                           *args], env={**os.environ, "FLEETSCOPE_INSTANCE_TYPE": instance_type},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("instance_type, gpus, efa", [
    ("p5.48xlarge", 8, 32), ("p5en.48xlarge", 8, 16), ("p4d.24xlarge", 8, 4), ("g6.xlarge", 0, 0),
])
def test_parallelcluster_action_sets_the_expected_counts(
    tmp_path: Path, instance_type: str, gpus: int, efa: int
) -> None:
    source_tree(tmp_path)
    result = run_on_node_configured(tmp_path, instance_type=instance_type)
    assert result.returncode == 0, result.stderr
    config = load(environ={}, yaml_path=tmp_path / "root" / "etc" / "fleetscope" / "config.yaml")
    assert (config.gpu.expected_count, config.efa.expected_count) == (gpus, efa)
    assert config.gpu.kmsg is True, "only the counts change; the rest of the shipped config stays"
    assert (tmp_path / "install.calls").read_text() == (
        f"--package {tmp_path / 'src'} --no-start --root {tmp_path / 'root'}\n")
    assert not (tmp_path / "root" / "etc" / "nhc").exists()


def test_parallelcluster_action_wires_nhc_once_and_takes_explicit_counts(tmp_path: Path) -> None:
    source_tree(tmp_path)
    for _ in range(2):  # ParallelCluster may run it again on a node; nothing doubles
        result = run_on_node_configured(tmp_path, "--nhc", "--gpus", "4", "--efa", "0",
                                        "--package", "fleetscope==1.2.3", instance_type="p6e-gb200.36xlarge")
        assert result.returncode == 0, result.stderr
    nhc = tmp_path / "root" / "etc" / "nhc"
    assert (nhc / "scripts" / "fleetscope.nhc").read_text() == NHC.read_text()
    assert (nhc / "nhc.conf").read_text() == "* || check_fleetscope\n"
    config = load(environ={}, yaml_path=tmp_path / "root" / "etc" / "fleetscope" / "config.yaml")
    assert (config.gpu.expected_count, config.efa.expected_count) == (4, 0)
    assert "--package fleetscope==1.2.3" in (tmp_path / "install.calls").read_text()


@pytest.mark.parametrize("args, message", [
    ((), "--source is required"),
    (("--source", "/nonexistent"), "no deploy/systemd/install.sh"),
    (("--source", "/nonexistent", "--gpus", "eight"), "take counts"),
    (("--frobnicate",), "unknown argument"),
])
def test_parallelcluster_action_refuses_bad_arguments(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = subprocess.run(["bash", str(ON_NODE_CONFIGURED), *args],
                            env={**os.environ, "FLEETSCOPE_INSTANCE_TYPE": "p5.48xlarge"}, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr
