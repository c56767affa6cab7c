"""``fleetscope check``: only a real finding exits 1; anything else is 2 ("could not tell"), within the timeout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from fleetscope.check.run import CLOSE_GRACE, EXIT_UNKNOWN, Checker, _HealthCall, run_check, summary, write_verdicts
from fleetscope.check.verdicts import CONDITIONS
from fleetscope.cli import CONDITION_CLOSE_GRACE, CONDITION_TIMEOUT, main
from fleetscope.collectors.gpu import GpuCollector
from fleetscope.collectors.protocol import Finding
from fleetscope.config import load
from fleetscope_sim.nvml_fake import install, load_scenario, uninstall, write_sysfs
from tests.conftest import ROOT


def run_cli(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["PYTHONPATH"] = os.path.join(ROOT, "exporter")
    return subprocess.run([sys.executable, "-m", "fleetscope", "check", *args], capture_output=True, text=True,
                          timeout=HANG, cwd=cwd, env=env, check=False)


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

    monkeypatch.setattr("fleetscope.check.run.run_check", explode)
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


HANG = 240  # seconds: guards a hang only (inside pytest-timeout's 300), never a verdict on speed


class Deadlines:
    """What run_check hands out, recorded: the deadline each collector's answer is waited for, and how long
    closing may take. The claim "one deadline for the whole check, closing adds at most its grace" is then
    about these values, not about how fast the machine ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.waits: list[float] = []
        self.closes: list[float] = []
        wait, close = _HealthCall.wait, Checker.close

        def recorded_wait(call: _HealthCall, deadline: float) -> bool:
            self.waits.append(deadline)
            return wait(call, deadline)

        def recorded_close(checker: Checker, grace: float) -> None:
            self.closes.append(grace)
            close(checker, grace)

        monkeypatch.setattr(_HealthCall, "wait", recorded_wait)
        monkeypatch.setattr(Checker, "close", recorded_close)

    def assert_one(self, timeout: float, asked: int, before: float, after: float, grace: float = CLOSE_GRACE) -> None:
        assert len(self.waits) == asked and len(set(self.waits)) == 1, self.waits  # one deadline, not one each
        assert before + timeout <= self.waits[0] <= after + timeout  # ``timeout`` from the check's start
        assert self.closes == [grace]


def checked(config, timeout: float, collectors, deadlines: Deadlines) -> tuple[list[Finding], int]:
    """run_check on a thread (a check that never returns fails the test instead of hanging it)."""
    result: list[tuple[list[Finding], int]] = []
    worker = threading.Thread(target=lambda: result.append(run_check(config, timeout, collectors)), daemon=True)
    before = time.monotonic()
    worker.start()
    worker.join(HANG)
    assert result, "check never returned"
    deadlines.assert_one(timeout, len(collectors), before, time.monotonic())
    return result[0]


def test_whole_check_answers_within_its_timeout_with_several_stuck_collectors(monkeypatch) -> None:
    config = load({}, environ={})
    stuck = [Stuck() for _ in range(3)]
    healthy = Healthy()
    try:
        findings, code = checked(config, 1.0, {"a": stuck[0], "b": stuck[1], "ok": healthy, "c": stuck[2]},
                                 Deadlines(monkeypatch))
        assert code == EXIT_UNKNOWN
        assert sorted(f.collector for f in findings) == ["a", "b", "c"]
        assert all(f.message == "no answer within 1s" for f in findings)
        assert healthy.closed and not any(s.closed for s in stuck)  # closing never waits on a stuck one's lock
    finally:
        for s in stuck:
            s.release.set()


def test_hanging_nvml_call_check_answers_unknown(tmp_path, monkeypatch) -> None:
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
        # A check that returns at all did not wait in close() on the lock the stuck read holds.
        findings, code = checked(config, 1.0, {"gpu": collector}, Deadlines(monkeypatch))
        assert code == EXIT_UNKNOWN
        assert [(f.collector, f.severity) for f in findings] == [("gpu", "unknown")]
        # Closing outside check (the daemon at shutdown) gives up on the held lock instead of hanging: the
        # stuck read holds it until the fake is released, below.
        closing = threading.Thread(target=collector._nvml.close, kwargs={"wait": 0.2}, daemon=True)
        closing.start()
        closing.join(HANG)
        assert not closing.is_alive(), "close() waited on the lock the stuck read holds"
    finally:
        fake.release()
        uninstall()


# -- one node condition, as node-problem-detector runs it ---------------------------------------------


@pytest.fixture
def gpu_node(tmp_path):
    """Flags for a node with the p5 EFA tree and an NVML fake's GPUs on the same sysfs; yields (flags, make)."""
    installed: list = []

    def make(scenario: str = "h100_8x_healthy", kmsg: str = "") -> tuple[list[str], object]:
        sysfs = tmp_path / "sys"
        shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "p5", "sys"), sysfs, symlinks=True)
        fake = load_scenario(scenario)
        write_sysfs(fake, str(sysfs))
        (tmp_path / "proc").mkdir()
        (tmp_path / "proc" / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
        (tmp_path / "kmsg").write_text(kmsg)
        install(fake)
        installed.append(fake)
        flags = ["--path.sysfs", str(sysfs), "--path.procfs", str(tmp_path / "proc"),
                 "--path.kmsg", str(tmp_path / "kmsg"), "--gpu.jobs-dir", str(tmp_path / "jobs")]
        return flags, fake

    yield make
    for fake in installed:
        if hasattr(fake, "release"):
            fake.release()
    uninstall()


def condition(capsys, name: str, *flags: str) -> tuple[int, str, str]:
    code = main(["check", "--condition", name, *flags])
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 1, "a condition's verdict is exactly one line"
    line = captured.out.rstrip("\n")
    assert len(line.encode()) <= 80 and line.isascii(), line
    return code, line, captured.err


def test_gpu_condition_healthy_node(gpu_node, capsys) -> None:
    flags, _ = gpu_node()
    assert condition(capsys, "gpu", *flags, "--gpu.expected-count", "8")[:2] == (0, "healthy")


def test_gpu_condition_names_the_fault_in_its_one_line(gpu_node, capsys) -> None:
    flags, _ = gpu_node("lost_gpu")
    code, line, err = condition(capsys, "gpu", *flags)
    assert (code, line) == (1, "gpu 3: lost (NVML: GPU is lost; fallen off the bus?)")
    assert "UNHEALTHY gpu: gpu 3: lost" in err


def test_gpu_condition_counts_the_other_faults(gpu_node, capsys) -> None:
    flags, fake = gpu_node()
    fake.gpu(2).set(ecc={"uncorrected_volatile": 4}, remapped_rows={"pending": 1})
    code, line, err = condition(capsys, "gpu", *flags, "--gpu.expected-count", "9")
    assert (code, line) == (1, "8 of 9 expected GPUs on the PCI bus (+3 more)")
    assert sum(row.startswith("UNHEALTHY gpu:") for row in err.splitlines()) == 4


def test_gpu_condition_reports_a_recent_fatal_xid(gpu_node, capsys) -> None:
    usec = int((time.time() - 1_700_000_000) * 1e6)
    xid = f"4,2,{usec},-;NVRM: Xid (PCI:0000:ca:00): 79, pid=1, name=p, GPU has fallen off the bus.\n"
    flags, _ = gpu_node(kmsg=xid)
    code, line, _ = condition(capsys, "gpu", *flags, "--gpu.kmsg")
    assert code == 1 and line.startswith("gpu 7: Xid 79 (") and line.endswith("x1 in the last 3600s")


def test_efa_condition(capsys) -> None:
    fixtures = os.path.join(ROOT, "tests", "fixtures")
    assert condition(capsys, "efa", "--path.sysfs", f"{fixtures}/p4d/sys")[:2] == (0, "healthy")
    assert condition(capsys, "efa", "--path.sysfs", f"{fixtures}/p4d/sys", "--efa.expected-count", "32")[:2] == (
        1, "4 EFA devices found, 32 expected")
    code, line, err = condition(capsys, "efa", "--path.sysfs", f"{fixtures}/malformed/sys")
    assert (code, line) == (1, "efa rdmap160s27: port 1 is DOWN, not ACTIVE (+1 more)")
    assert "UNKNOWN efa: efa rdmap144s27: no hw_counters directory" in err


def test_each_condition_reports_only_its_own_findings(gpu_node, capsys) -> None:
    flags, _ = gpu_node("lost_gpu")
    assert condition(capsys, "efa", *flags)[:2] == (0, "healthy")
    assert condition(capsys, "gpu", *flags)[0] == 1


def test_training_condition_without_prometheus_is_could_not_tell(capsys) -> None:
    assert condition(capsys, "training")[:2] == (EXIT_UNKNOWN, "could not tell: check.prometheus-url is not set")


def test_disabled_collector_condition_is_could_not_tell(capsys) -> None:
    expected = (EXIT_UNKNOWN, "could not tell: gpu: collector disabled")
    assert condition(capsys, "gpu", "--no-collector.gpu")[:2] == expected


def test_gpu_condition_answers_within_the_plugin_timeout_when_nvml_hangs(gpu_node, capsys, monkeypatch) -> None:
    flags, _ = gpu_node("hanging_call")
    deadlines = Deadlines(monkeypatch)
    before = time.monotonic()
    code, line, _ = condition(capsys, "gpu", *flags)
    assert (code, line) == (EXIT_UNKNOWN, "could not tell: gpu: no answer within 3s")
    # node-problem-detector kills a plugin after 5 s: the condition's one deadline and its closing grace fit
    # inside that with room for the interpreter's start (what they are, not how fast this machine ran them).
    deadlines.assert_one(CONDITION_TIMEOUT, 1, before, time.monotonic(), grace=CONDITION_CLOSE_GRACE)
    assert CONDITION_TIMEOUT + CONDITION_CLOSE_GRACE <= 5 - 1.5


def test_configuration_error_in_condition_mode_is_one_line(capsys, monkeypatch) -> None:
    monkeypatch.setenv("FLEETSCOPE_CHECK_BREAKER_PERCENT", "lots")
    code, line, err = condition(capsys, "training")
    assert code == EXIT_UNKNOWN and line.startswith("could not tell: configuration error: environment")
    assert "FLEETSCOPE_CHECK_BREAKER_PERCENT" in err


@pytest.mark.parametrize("findings, code, expected", [
    ([], 0, "healthy"),
    ([Finding("efa", "unhealthy", "node", "4 EFA devices found, 32 expected")], 1, "4 EFA devices found, 32 expected"),
    ([Finding("gpu", "unknown", "collector", "no answer within 3s"),
      Finding("gpu", "unhealthy", "gpu 1", "row remapping failed")], 1, "gpu 1: row remapping failed"),
    ([Finding("gpu", "unknown", "collector", "no answer within 3s")], 2, "could not tell: gpu: no answer within 3s"),
    ([Finding("training", "unhealthy", "", "straggler: rank 3, GPU throttled, job " + "très-long-" * 9)]
     + [Finding("training", "unhealthy", "", "x")] * 11, 1,
     "straggler: rank 3, GPU throttled, job tr?s-long-tr?s-long-tr?s-lon... (+11 more)"),
])
def test_summary_is_one_ascii_line_of_at_most_80_characters(findings, code, expected) -> None:
    assert summary(findings, code) == expected
    assert len(expected) <= 80


def test_a_collector_stuck_across_rounds_is_asked_once_and_comes_back() -> None:
    stuck = Stuck()
    checker = Checker({"gpu": stuck, "ok": Healthy()})
    threads = threading.active_count()
    try:
        for round_ in range(3):
            checker.start()
            checker._calls["ok"]._thread.join(HANG)  # the healthy one answered, however slow the machine
            findings = checker.finish(time.monotonic(), 0.2)  # the stuck one has had its time
            assert [(f.collector, f.severity) for f in findings] == [("gpu", "unknown")]
            assert findings[0].message == ("no answer within 0.2s" if round_ == 0 else findings[0].message)
            assert round_ == 0 or findings[0].message.startswith("no answer for ")
        assert threading.active_count() == threads + 1, "one thread for the stuck call, not one per round"
    finally:
        stuck.release.set()
    checker.start()
    assert checker.finish(time.monotonic() + HANG, 5) == []  # returns once both answered
    assert checker.busy == set()


def test_write_verdicts_replaces_each_condition_file(tmp_path) -> None:
    findings = [Finding("gpu", "unhealthy", "gpu 3", "lost"),
                Finding("training", "unknown", "", "Prometheus unreachable")]
    write_verdicts(str(tmp_path), findings, CONDITIONS.values())
    assert (tmp_path / "gpu").read_text() == "1\ngpu 3: lost\nUNHEALTHY gpu: gpu 3: lost\n"
    assert (tmp_path / "efa").read_text() == "0\nhealthy\n"
    assert (tmp_path / "training").read_text() == (
        "2\ncould not tell: Prometheus unreachable\nUNKNOWN training: Prometheus unreachable\n")
    write_verdicts(str(tmp_path), [], CONDITIONS.values())
    assert (tmp_path / "gpu").read_text() == "0\nhealthy\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["efa", "gpu", "training"], "no temporary file left"


def test_check_under_the_clients_own_environment(gpu_node, capsys, monkeypatch) -> None:
    """A check started from a training process inherits what the rank's tracker set (#35 item 9)."""
    from fleetscope.client.placement import RANK_PROCESS_VAR, claim_rank
    monkeypatch.delenv(RANK_PROCESS_VAR, raising=False)  # restored after the test
    claim_rank("train-1", 0)
    assert RANK_PROCESS_VAR in os.environ
    flags, _ = gpu_node()
    assert condition(capsys, "gpu", *flags, "--gpu.expected-count", "8")[:2] == (0, "healthy")
