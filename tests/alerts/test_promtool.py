"""promtool accepts every rule file, and its unit tests cover every alert, firing and silent."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetscope_sim.virtual import promtool_test_rules

from .rulefiles import (
    ALERTS_DIR,
    DCGM_FILE,
    PLAIN_FILES,
    PROMETHEUSRULE_FILE,
    TESTS_DIR,
    load_groups,
    needed_groups,
    promtool_test_on_needed_groups,
)

PROMTOOL = shutil.which("promtool")
# Skipped where promtool is missing, except in CI, where its absence is a broken install.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"), reason="promtool not installed (apt-get install prometheus)"
)]
UNIT_TEST_FILES = sorted(TESTS_DIR.glob("*.test.yml"))


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=600, check=False)


def lint_flags() -> list[str]:
    """--lint=all where this promtool has it (2.33+)."""
    help_text = promtool("check", "rules", "--help").stdout + promtool("check", "rules", "--help").stderr
    return ["--lint=all", "--lint-fatal"] if "--lint" in help_text else []


@pytest.mark.parametrize("name", [*PLAIN_FILES, PROMETHEUSRULE_FILE, DCGM_FILE])
def test_check_rules_is_clean(name: str, tmp_path: Path) -> None:
    path = ALERTS_DIR / name
    if name == PROMETHEUSRULE_FILE:  # promtool reads plain rule files: check the CRD's spec
        path = tmp_path / "spec.rules.yml"
        path.write_text(yaml.safe_dump({"groups": load_groups(name)}), encoding="utf-8")
    result = promtool("check", "rules", *lint_flags(), str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


@pytest.mark.parametrize("path", UNIT_TEST_FILES, ids=[p.name for p in UNIT_TEST_FILES])
def test_promtool_unit_tests_pass(path: Path, tmp_path: Path) -> None:
    """Each unit-test file passes over the groups of the committed rule files that it can observe (the rest would
    only cost time: promtool evaluates every loaded group at every step); `promtool test rules FILE` by hand runs
    it over the whole files and passes as well."""
    result = promtool_test_rules(promtool_test_on_needed_groups(path, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_needed_groups_follow_records_and_alerts_and_drop_the_rest() -> None:
    groups = [
        {"name": "base", "rules": [{"record": "job:a:rate", "expr": "rate(a_total[1m])"}]},
        {"name": "mid", "rules": [{"record": "job:a:ratio", "expr": "job:a:rate / 2"}]},
        {"name": "alert", "rules": [{"alert": "AHigh", "expr": "job:a:ratio > 1"}]},
        {"name": "meta", "rules": [{"record": "job:a:alerting", "expr": 'ALERTS{alertname="AHigh"}'}]},
        {"name": "near", "rules": [{"record": "job:a:rate_total", "expr": "sum(a_total)"}]},
        {"name": "ordered", "rules": [{"record": "job:b:rate", "expr": "rate(b_total[1m])"}]},
    ]
    def kept(test_text: str, always: frozenset[str] = frozenset()) -> list[str]:
        return [group["name"] for group in needed_groups(groups, test_text, set(always))]
    assert kept("alertname: AHigh") == ["base", "mid", "alert"]
    assert kept("expr: job:a:alerting > 0") == ["base", "mid", "alert", "meta"]
    assert kept("expr: job:a:rate_total", frozenset({"ordered"})) == ["near", "ordered"]
    assert kept("expr: a_total") == []


def alert_tests(rule_file: str) -> list[dict[str, Any]]:
    """Every alert_rule_test of the unit-test files that load ``rule_file``."""
    out = []
    for path in UNIT_TEST_FILES:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not any(Path(f).name == rule_file for f in document["rule_files"]):
            continue
        for group in document["tests"]:
            out += group.get("alert_rule_test", [])
    return out


def test_every_alert_fires_with_its_labels_and_has_a_near_miss(production_alerts: list[dict[str, Any]]) -> None:
    tests = alert_tests("fleetscope.rules.yml")
    fired: dict[str, set[str]] = defaultdict(set)
    silent: set[str] = set()
    for test in tests:
        if not test.get("exp_alerts"):
            silent.add(test["alertname"])
        for alert in test.get("exp_alerts") or []:
            labels = alert["exp_labels"]
            fired[test["alertname"]].add(labels["severity"])
            assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}
            assert len(labels) > 1, f"{test['alertname']}: a firing test must name the alert's labels"
    missing_fire = {
        (rule["alert"], rule["labels"]["severity"]) for rule in production_alerts
        if rule["labels"]["severity"] not in fired.get(rule["alert"], set())
    }
    missing_silent = {rule["alert"] for rule in production_alerts} - silent
    assert not missing_fire, f"alerts with no firing test: {sorted(missing_fire)}"
    assert not missing_silent, f"alerts with no near-miss test: {sorted(missing_silent)}"


def test_unit_tests_only_name_existing_alerts(production_alerts: list[dict[str, Any]]) -> None:
    names = {rule["alert"] for rule in production_alerts}
    assert {test["alertname"] for test in alert_tests("fleetscope.rules.yml")} <= names
