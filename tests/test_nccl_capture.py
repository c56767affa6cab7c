"""scripts/nccl-inspector-capture: the steps that need no GPU (fetch, keep, and refusing to run unprepared)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, require_binary

SCRIPT = os.path.join(ROOT, "scripts", "nccl-inspector-capture")


def capture(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(repo / "scripts" / "nccl-inspector-capture"), *args], capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the script in a scratch repository layout (it writes under its own repository)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    return tmp_path


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True, timeout=30)


@pytest.mark.parametrize("path", ["plugins/profiler/inspector", "ext-profiler/inspector"])
def test_fetch_copies_the_plugin_sources_at_a_tag_from_either_layout(repo: Path, tmp_path: Path, path: str) -> None:
    nccl = tmp_path / "nccl"
    (nccl / path).mkdir(parents=True)
    (nccl / path / "Makefile").write_text("all:\n")
    (nccl / path / "inspector.cc").write_text("// plugin\n")
    git(nccl, "init", "-q")
    git(nccl, "add", ".")
    git(nccl, "commit", "-q", "-m", "x")
    git(nccl, "tag", "v2.29.2-1")
    result = capture(repo, "fetch", str(nccl), "v2.29.2-1")
    assert result.returncode == 0, result.stderr
    src = repo / "build" / "nccl-inspector" / "src"
    assert sorted(p.name for p in src.iterdir()) == ["Makefile", "NCCL_TAG", "inspector.cc"]
    assert (src / "NCCL_TAG").read_text().strip() == "v2.29.2-1"
    assert capture(repo, "fetch", str(nccl), "v9.9.9-1").returncode != 0


def test_run_refuses_without_carried_sources(repo: Path) -> None:
    result = capture(repo, "run", str(repo / "out"))
    assert result.returncode == 1 and "fetch" in result.stderr


def test_keep_files_a_run_as_a_real_fixture_the_parser_test_reads(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(os.path.join(FIXTURES, "nccl", "v2.30", "llm-pretrain-worker-3-pid17.log"), out / "gpu0-pid4242.log")
    (out / "build.log").write_text("make\n")
    (out / "MANIFEST").write_text("nccl_runtime=2.30.7\ngpu=NVIDIA H100 80GB HBM3, 580.159.04\ntiming=default\n")
    result = capture(repo, "keep", str(out))
    assert result.returncode == 0, result.stderr
    kept = repo / "tests" / "fixtures" / "nccl" / "real-nvidia-h100-80gb-hbm3"
    assert sorted(p.name for p in kept.iterdir()) == ["MANIFEST", "gpu0-pid4242.log"]
    assert capture(repo, "keep", str(tmp_path)).returncode == 1  # no MANIFEST: not a run's output


def test_usage() -> None:
    result = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2 and "fetch SRC" in result.stdout


def test_passes_shellcheck() -> None:
    shellcheck = require_binary("shellcheck")
    result = subprocess.run([shellcheck, "-x", "--severity=style", SCRIPT], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout
