"""benchmarks/device_phases.py (#26's reference case for a real GPU): its logic on the CPU, so it cannot rot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import device_phases
from tests.conftest import free_port


def test_busy_time_merges_overlapping_operations_and_counts_the_gaps() -> None:
    merged = device_phases.merged_busy([(0.0, 0.010), (0.005, 0.012), (0.020, 0.030), (0.021, 0.022)])
    assert merged["span"] == pytest.approx(0.030)
    assert merged["busy"] == pytest.approx(0.022)
    assert merged["idle"] == pytest.approx(0.008)
    assert device_phases.merged_busy([])["operations"] == 0


def test_the_device_timeline_reads_kernels_and_copies_from_the_profilers_trace() -> None:
    class Profiler:  # what torch.profiler.profile exports: a Chrome trace, times in microseconds
        def export_chrome_trace(self, path: str) -> None:
            events: list[dict[str, Any]] = [
                {"ph": "X", "cat": "gpu_memcpy", "ts": 1000, "dur": 2000},
                {"ph": "X", "cat": "kernel", "ts": 3000, "dur": 5000},
                {"ph": "X", "cat": "cuda_runtime", "ts": 0, "dur": 20000},  # the host's side: not device time
                {"ph": "X", "cat": "Kernel", "ts": 12000, "dur": 4000},
                {"ph": "i", "cat": "kernel", "ts": 30000},
            ]
            Path(path).write_text(json.dumps({"traceEvents": events}))

    timeline = device_phases.device_timeline(Profiler())
    assert timeline["operations"] == 3
    assert timeline["span"] == pytest.approx(0.015)
    assert timeline["busy"] == pytest.approx(0.011)
    assert timeline["idle"] == pytest.approx(0.004)


def test_the_job_is_one_torchrun_process_running_this_file() -> None:
    command = device_phases.torchrun_command(["--out", "x"])
    assert command[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                            device_phases.__file__]
    assert command[7:] == ["--rank-run", "--out", "x"]


@pytest.mark.slow
def test_the_reference_case_runs_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole logic on a gloo world of one, the rank in this process (torchrun's start costs ~20 s here)."""
    pytest.importorskip("torch")
    out = tmp_path / "out"
    argv = ["--out", str(out), "--device", "cpu", "--width", "32", "--layers", "2", "--batch", "16",
            "--steps", "8", "--warmup", "2", "--profile-steps", "0", "--stall-ms", "30"]
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)

    def in_this_process(args: Any, argv: list[str]) -> bool:
        return device_phases.main(["--rank-run", *argv]) == 0

    assert device_phases.driver(device_phases.parse(argv), argv, launch=in_this_process) == 0
    results = json.loads((out / device_phases.RESULTS).read_text())
    report = (out / device_phases.REPORT).read_text()
    assert "| stall |" in report and "| no_stall |" in report and "the two views" in report
    for case in device_phases.CASES:
        assert results["cases"][case]["tracker"]["sent"] == 8 + 2 == len(results["cases"][case]["steps"])
        assert results["cases"][case]["tracker"]["errors"] == 0
    stall = results["summary"]["stall"]
    per_step = stall["per_step"]
    # On the CPU the host is the device: the loader's time is the wait.
    assert per_step["data_seconds"]["mean"] == pytest.approx(per_step["fetch_seconds"]["mean"])
    # The independent measure, on the same steps and clock (not a second run's, which a loaded machine stretches
    # by its own amount): the dataset timed its 30 ms stall itself, and each data phase holds that call.
    assert stall["getitem_per_step"] >= 0.03
    assert per_step["data_seconds"]["mean"] >= stall["getitem_per_step"]
    # Each step is booked once: the measured steps after the first fit between the first's end and the last's.
    window = sorted((s for s in results["cases"]["stall"]["steps"] if 2 < s["step"] <= 2 + 8), key=lambda s: s["step"])
    assert len(window) == stall["measured_steps"] == 8
    span = window[-1]["timestamp"] - window[0]["timestamp"]
    assert sum(s["step_seconds"] for s in window[1:]) <= span + 1e-3
    assert stall["wall_per_step"] == pytest.approx(span / 7)
    # The reference figure: the stalled run's wall less the no-stall run's busy time (on the CPU, its wall).
    no_stall = results["summary"]["no_stall"]
    assert stall["idle_wall_minus_no_stall_busy"] == pytest.approx(stall["wall_per_step"] - no_stall["wall_per_step"])
