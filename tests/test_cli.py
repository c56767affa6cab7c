from __future__ import annotations

import subprocess
import sys

from fleetscope.check.run import run_check
from fleetscope.cli import build_parser, main
from fleetscope.collectors.protocol import Finding
from fleetscope.config import load


def test_every_collector_has_on_and_off_flags():
    parser = build_parser()
    args = parser.parse_args(["serve", "--no-collector.gpu", "--collector.efa", "--path.sysfs", "/x"])
    values = vars(args)
    assert values["setting:collector.gpu"] is False
    assert values["setting:collector.efa"] is True
    assert values["setting:path.sysfs"] == "/x"
    assert "setting:web.listen-address" not in values  # not given: env and YAML may still set it


def test_bad_setting_stops_start_up_naming_the_key(capsys):
    code = main(["serve", "--collector.efa.interval", "often"])
    assert code == 3
    assert "--collector.efa.interval" in capsys.readouterr().err


def test_bad_environment_value_stops_start_up(monkeypatch, capsys):
    monkeypatch.setenv("FLEETSCOPE_PUSH_MAX_JOBS", "many")
    assert main(["check"]) == 2  # check: a configuration error is "could not tell"
    assert "FLEETSCOPE_PUSH_MAX_JOBS" in capsys.readouterr().err


def test_console_script_runs_as_module():
    result = subprocess.run(
        [sys.executable, "-m", "fleetscope", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and "fleetscope" in result.stdout


class Healthy:
    def health(self):
        return []


class Sick:
    def health(self):
        return [Finding("sick", "unhealthy", "efa rdmap79s0", "device missing")]


class Unsure:
    def health(self):
        raise OSError("permission denied")


def test_check_verdicts():
    config = load({}, environ={})
    assert run_check(config, collectors={"a": Healthy()})[1] == 0
    findings, code = run_check(config, collectors={"a": Healthy(), "b": Sick(), "c": Unsure()})
    assert code == 1
    assert [f.severity for f in findings] == ["unhealthy", "unknown"]
    assert run_check(config, collectors={"c": Unsure()})[1] == 2
    assert findings[0].line() == "UNHEALTHY sick: efa rdmap79s0: device missing"
