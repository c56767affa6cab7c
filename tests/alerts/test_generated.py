"""The committed rule files are the generator's output, and the generator honours its settings."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from fleetscope.promql import JOB_STRAGGLER_THRESHOLD
from fleetscope.rules.render import OUTPUTS, render, stale_outputs
from fleetscope.rules.settings import E2E, PRODUCTION, Settings, seconds

from .rulefiles import ALERTS_DIR, PROMETHEUSRULE_FILE, iter_rules, load_groups

# A raw metric in an expression: not the middle of a recording rule name (level:metric:ops).
RAW_METRIC = re.compile(r"(?<![\w:])(fleetscope_\w+|up)\b(?!:)(\{[^}]*\})?")


def test_committed_files_match_the_generator() -> None:
    assert stale_outputs(ALERTS_DIR) == [], "run: python3 alerts/generate.py"


def test_every_output_is_committed() -> None:
    assert sorted(OUTPUTS) == sorted(p.name for p in ALERTS_DIR.glob("fleetscope.*.y*ml"))


def test_prometheusrule_carries_the_same_groups_as_the_rule_file() -> None:
    document = yaml.safe_load((ALERTS_DIR / PROMETHEUSRULE_FILE).read_text(encoding="utf-8"))
    assert document["apiVersion"] == "monitoring.coreos.com/v1"
    assert document["kind"] == "PrometheusRule"
    assert document["metadata"]["name"] == "fleetscope"
    assert document["spec"]["groups"] == load_groups("fleetscope.rules.yml")


def test_e2e_preset_is_time_compressed() -> None:
    groups = load_groups("fleetscope.e2e.rules.yml")
    # The straggler records sample every straggler_sample_window: at least two scrapes (of 5 s) in each sample.
    assert {group["interval"] for group in groups} == {"5s", E2E.straggler_sample_window}
    rules = list(iter_rules(groups))
    assert all(seconds(rule["for"]) <= 60 for rule in rules if "for" in rule)
    windows = {w for rule in rules for w in re.findall(r"\[(\d+[smhd])\]", rule["expr"])}
    offsets = {w for rule in rules for w in re.findall(r"offset (\d+[smhd])", rule["expr"])}
    assert windows and max(seconds(w) for w in windows) <= 120
    assert offsets and max(seconds(w) for w in offsets) <= 240  # the ECC hour before the last one, compressed


def test_e2e_preset_keeps_the_production_thresholds() -> None:
    thresholds = [f.name for f in dataclasses.fields(Settings) if isinstance(getattr(PRODUCTION, f.name), float)]
    changed = {name for name in thresholds if getattr(PRODUCTION, name) != getattr(E2E, name)}
    # The durations a job waits before a hang or silence is declared, compressed with everything else; the fast
    # path (a rank its peers wait for, 15 s at least) runs at production values.
    # The straggler samples a window needs before it judges: a compressed window holds fewer.
    assert changed == {"hang_min_seconds", "hang_max_seconds", "hang_pause_seconds", "silent_after_seconds",
                       "running_report_seconds"}


@pytest.mark.parametrize("fmt", ["rules", "prometheusrule"])
def test_selector_reaches_every_raw_series(fmt: str) -> None:
    settings = dataclasses.replace(PRODUCTION, selector='job="gpu-nodes", cluster="c1"')
    document = yaml.safe_load(render(settings, fmt))  # type: ignore[arg-type]
    groups = document["spec"]["groups"] if fmt == "prometheusrule" else document["groups"]
    seen = 0
    for rule in iter_rules(groups):
        texts = [rule["expr"], *rule.get("annotations", {}).values()]
        for text in texts:
            for match in RAW_METRIC.finditer(text):
                seen += 1
                assert match.group(2) and 'job="gpu-nodes", cluster="c1"' in match.group(2), (rule, match.group(0))
    assert seen > 100
    assert 'job="fleetscope"' not in render(settings, fmt)  # type: ignore[arg-type]


def test_thresholds_and_windows_come_from_settings() -> None:
    settings = dataclasses.replace(PRODUCTION, straggler_min_excess=0.05, rate_window="4m", share_window="3m",
                                   input_for="7m")
    rules = {
        (rule.get("alert") or rule.get("record"), rule.get("labels", {}).get("severity")): rule
        for rule in iter_rules(yaml.safe_load(render(settings))["groups"])
    }
    threshold = rules[(JOB_STRAGGLER_THRESHOLD, None)]["expr"]
    assert "0.05\n" in threshold and "0.01" not in threshold
    assert rules[("TrainingInputBound", "warning")]["for"] == "7m"
    assert "[3m]" in rules[("rank:fleetscope_training_data_seconds_per_step_seconds:ratio_rate", None)]["expr"]
    assert "[3m]" in rules[("GpuPcieReplaysHigh", "warning")]["expr"]
    assert "[4m]" in rules[("EfaRxDrops", "warning")]["expr"]


def test_runbook_base_url_is_configurable() -> None:
    settings = dataclasses.replace(PRODUCTION, runbook_base_url="https://runbooks.example/fleetscope")
    document = yaml.safe_load(render(settings))
    urls = {rule["annotations"]["runbook_url"] for rule in iter_rules(document["groups"]) if "alert" in rule}
    assert "https://runbooks.example/fleetscope#gpulost" in urls


@pytest.mark.parametrize("change, reason", [
    ({"slowdown_ratio": 1.02}, "slowdown_ratio"),  # would alert on diurnal swings
    ({"straggler_critical_score": 0.995}, "straggler_critical_score"),  # critical must be stricter than warning
    ({"straggler_min_excess": 0.004}, "straggler_min_excess"),  # flags healthy ranks
    ({"hang_min_seconds": 3600.0}, "hang_min_seconds"),
    ({"input_for": "ten minutes"}, "Prometheus duration"),
    ({"evaluation_interval": "5"}, "Prometheus duration"),
])
def test_settings_refuse_unusable_values(change: dict[str, object], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        dataclasses.replace(PRODUCTION, **change)


def test_rules_command_prints_and_checks(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from fleetscope.rules.cli import main

    assert main(["--preset", "e2e", "--selector", 'job="x"']) == 0
    assert 'job="x"' in capsys.readouterr().out
    assert main(["--check", str(tmp_path)]) == 1
    assert main(["--write", str(tmp_path)]) == 0
    assert main(["--check", str(tmp_path)]) == 0


def test_keep_firing_for_can_be_left_out_for_older_rulers(capsys: pytest.CaptureFixture[str]) -> None:
    from fleetscope.rules.cli import main

    assert main(["--keep-firing-for", ""]) == 0
    groups = yaml.safe_load(capsys.readouterr().out)["groups"]
    alerts = [rule for group in groups for rule in group["rules"] if "alert" in rule]
    assert alerts and not any("keep_firing_for" in rule for rule in alerts)
    assert main([]) == 0
    groups = yaml.safe_load(capsys.readouterr().out)["groups"]
    assert all(rule["keep_firing_for"] == PRODUCTION.keep_firing_for for g in groups for rule in g["rules"]
               if "alert" in rule)
