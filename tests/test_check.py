"""``fleetscope check``: only a real finding exits 1; anything else is 2 ("could not tell"), within the timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from fleetscope.check import CLOSE_GRACE, run_check
from fleetscope.cli import main
from fleetscope.collectors.gpu import GpuCollector
from fleetscope.config import load
from fleetscope.health import EXIT_UNKNOWN, Finding
from fleetscope_sim.nvml_fake import install, load_scenario, uninstall, write_sysfs
from tests.conftest import ROOT


def run_cli(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["PYTHONPATH"] = os.path.join(ROOT, "exporter")
    return subprocess.run([sys.executable, "-m", "fleetscope", "check", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env, check=False)


def test_config_with_a_latin1_byte_exits_unknown_with_one_line(tmp_path) -> None:
    config = tmp_path / "config.yaml"
    config.write_bytes(b"# Kn\xf6del\nlog:\n  level: info\n")
    result = run_cli("--config", str(config), "--no-collector.gpu", "--no-collector.ena", cwd=str(tmp_path))
    assert result.returncode == EXIT_UNKNOWN, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "not UTF-8" in lines[0] and "0xf6" in lines[0]


def test_unexpected_error_exits_unknown_not_unhealthy(monkeypatch, capsys) -> None:
    def explode(*args, **kwargs):
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr("fleetscope.check.run_check", explode)
    assert main(["check"]) == EXIT_UNKNOWN
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fleetscope check: could not tell: RuntimeError: something nobody expected"]


def test_configuration_error_exits_unknown(monkeypatch, capsys) -> None:
    monkeypatch.setenv("FLEETSCOPE_PUSH_MAX_JOBS", "many")
    assert main(["check"]) == EXIT_UNKNOWN
    assert "FLEETSCOPE_PUSH_MAX_JOBS" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-3", "soon"])
def test_timeout_must_be_finite_and_positive(value, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["check", "--timeout", value])
    assert exited.value.code == 2
    assert "--timeout" in capsys.readouterr().err


class Stuck:
    """health() never returns until released; close() then waits on the same lock, as the NVML source does."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.closed = False

    def health(self) -> list[Finding]:
        with self.lock:
            self.release.wait()
        return []

    def close(self) -> None:
        with self.lock:
            self.closed = True


class Healthy:
    def __init__(self) -> None:
        self.closed = False

    def health(self) -> list[Finding]:
        return []

    def close(self) -> None:
        self.closed = True


def timed_check(config, timeout: float, collectors) -> tuple[float, tuple[list[Finding], int] | None]:
    """run_check on a thread (today's code never returns): (seconds taken, result or None)."""
    result: list[tuple[list[Finding], int]] = []
    worker = threading.Thread(target=lambda: result.append(run_check(config, timeout, collectors)), daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(timeout + CLOSE_GRACE + 15)
    return time.monotonic() - started, (result[0] if result else None)


def test_whole_check_answers_within_its_timeout_with_several_stuck_collectors() -> None:
    config = load({}, environ={})
    stuck = [Stuck() for _ in range(3)]
    healthy = Healthy()
    try:
        took, result = timed_check(config, 1.0, {"a": stuck[0], "b": stuck[1], "ok": healthy, "c": stuck[2]})
        assert result is not None, "check never returned"
        # One deadline for the whole check, not one per collector; closing adds at most its grace.
        assert took < 1.0 + CLOSE_GRACE + 3
        findings, code = result
        assert code == EXIT_UNKNOWN
        assert sorted(f.collector for f in findings) == ["a", "b", "c"]
        assert all(f.message == "no answer within 1s" for f in findings)
        assert healthy.closed and not any(s.closed for s in stuck)
    finally:
        for s in stuck:
            s.release.set()


def test_hanging_nvml_call_check_answers_unknown(tmp_path) -> None:
    fake = load_scenario("hanging_call")  # nvmlDeviceGetPowerUsage never returns
    write_sysfs(fake, str(tmp_path / "sys"))
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    (tmp_path / "kmsg").write_text("")
    install(fake)
    try:
        config = load({"path.sysfs": str(tmp_path / "sys"), "path.procfs": str(tmp_path / "proc"),
                       "path.kmsg": str(tmp_path / "kmsg"), "gpu.jobs-dir": str(tmp_path / "jobs")}, environ={})
        collector = GpuCollector(config)
        took, result = timed_check(config, 1.0, {"gpu": collector})
        assert result is not None, "check never returned: close() waited on the lock the stuck read holds"
        assert took < 1.0 + CLOSE_GRACE + 3
        findings, code = result
        assert code == EXIT_UNKNOWN
        assert [(f.collector, f.severity) for f in findings] == [("gpu", "unknown")]
        # Closing outside check (the daemon at shutdown) gives up on the held lock instead of hanging.
        started = time.monotonic()
        collector._nvml.close(wait=0.2)
        assert time.monotonic() - started < 2
    finally:
        fake.release()
        uninstall()
