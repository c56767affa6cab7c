"""`fleetscope rules --values`: an operator tunes thresholds, for: and the runbook base URL without Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetscope.rules.cli import main
from fleetscope.rules.render import doc_counts, with_doc_counts
from fleetscope.rules.settings import PRODUCTION, RUNBOOK_BASE_URL, SettingsError, with_values

from .rulefiles import REPO, iter_rules, load_groups
from .test_promtool import PROMTOOL, lint_flags, promtool

TUNING = """\
# A site's tuning: GPU throttling is normal below 40% here, and only worth a page after 20 minutes.
throttle_share: 0.4
throttle_for: 20m
runbook_base_url: https://wiki.example.com/gpu/runbooks
"""


def alert(groups: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = (rule for rule in iter_rules(groups) if rule.get("alert") == name)
    return found


def run_rules(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_shipped_runbook_url_is_absolute() -> None:
    for name in ("fleetscope.rules.yml", "fleetscope.prometheusrule.yaml", "fleetscope.e2e.rules.yml"):
        for rule in iter_rules(load_groups(name)):
            if "alert" in rule:
                assert rule["annotations"]["runbook_url"].startswith(f"{RUNBOOK_BASE_URL}#"), (name, rule["alert"])


def test_a_values_file_changes_a_threshold_a_for_and_the_runbook_base(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = tmp_path / "tuning.yaml"
    values.write_text(TUNING, encoding="utf-8")
    code, out, err = run_rules(["--values", str(values)], capsys)
    assert code == 0, err
    groups = yaml.safe_load(out)["groups"]
    throttled = alert(groups, "GpuThrottled")
    assert throttled["expr"].endswith("> 0.4") and throttled["for"] == "20m"
    assert throttled["annotations"]["runbook_url"] == "https://wiki.example.com/gpu/runbooks#gputhrottled"
    # Only what the file names changed: everything else is the shipped rule set.
    shipped = load_groups("fleetscope.rules.yml")
    assert alert(groups, "GpuLost") == {
        **alert(shipped, "GpuLost"),
        "annotations": {**alert(shipped, "GpuLost")["annotations"],
                        "runbook_url": "https://wiki.example.com/gpu/runbooks#gpulost"},
    }
    assert str(values) in out.splitlines()[0]  # the header says which tuning made the file
    if PROMTOOL is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    rules = tmp_path / "tuned.rules.yml"
    rules.write_text(out, encoding="utf-8")
    result = promtool("check", "rules", *lint_flags(), str(rules))
    assert result.returncode == 0, result.stdout + result.stderr


def test_set_applies_after_the_values_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "tuning.yaml"
    values.write_text(TUNING, encoding="utf-8")
    code, out, err = run_rules(["--values", str(values), "--set", "throttle_for=30m", "--format", "prometheusrule"],
                               capsys)
    assert code == 0, err
    document = yaml.safe_load(out)
    assert document["kind"] == "PrometheusRule"
    assert alert(document["spec"]["groups"], "GpuThrottled")["for"] == "30m"


def test_helm_values_carry_the_groups_and_the_tuning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "tuning.yaml"
    values.write_text(TUNING, encoding="utf-8")
    code, out, err = run_rules(["--values", str(values), "--format", "helm-values"], capsys)
    assert code == 0, err
    rule_values = yaml.safe_load(out)["prometheusRule"]
    assert rule_values["settings"] == yaml.safe_load(TUNING)
    assert alert(rule_values["groups"], "GpuThrottled")["for"] == "20m"


@pytest.mark.parametrize("text, message", [
    ("throttle_fro: 20m\n", "tuning.yaml: unknown setting 'throttle_fro' (did you mean 'throttle_for'?)"),
    ("straggler_ratio: 1.2\n", "tuning.yaml: unknown setting 'straggler_ratio'"),
    ("throttle_share: high\n", "tuning.yaml: throttle_share takes a number, got 'high'"),
    ("throttle_for: 20\n", "tuning.yaml: throttle_for takes a string"),
    ("throttle_for: twenty minutes\n", "tuning.yaml: expected a Prometheus duration"),
    ("slowdown_ratio: 1.01\n", "tuning.yaml: slowdown_ratio below 1.03"),
    ("- throttle_for\n", "tuning.yaml: expected a mapping of setting names"),
    ("throttle_for: [\n", "tuning.yaml: not valid YAML"),
])
def test_a_bad_values_file_is_one_line_on_stderr(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = tmp_path / "tuning.yaml"
    values.write_text(text, encoding="utf-8")
    code, out, err = run_rules(["--values", str(values)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fleetscope rules: ") and message in err, err


def test_missing_values_file_and_bad_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_rules(["--values", str(tmp_path / "absent.yaml")], capsys)
    assert code == 2 and err.count("\n") == 1 and "absent.yaml" in err
    code, _, err = run_rules(["--set", "throttle_for"], capsys)
    assert code == 2 and "expected NAME=VALUE" in err
    code, _, err = run_rules(["--values", str(tmp_path / "absent.yaml"), "--write", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1


def test_with_values_keeps_types_and_refuses_booleans() -> None:
    tuned = with_values(PRODUCTION, {"throttle_share": 1, "keep_firing_for": ""})
    assert tuned.throttle_share == 1.0 and isinstance(tuned.throttle_share, float)
    assert tuned.keep_firing_for == ""
    with pytest.raises(SettingsError, match="takes a number"):
        with_values(PRODUCTION, {"throttle_share": True})


def test_docs_state_the_shipped_rule_sets_size() -> None:
    """docs/deploy.md's counts are generated (alerts/generate.py), so they match the committed rule file."""
    groups = load_groups("fleetscope.rules.yml")
    rules = list(iter_rules(groups))
    alerts = sum("alert" in rule for rule in rules)
    counts = doc_counts()
    assert counts["rule-counts"] == (f"The set is {len(rules)} rules ({alerts} alerts, {len(rules) - alerts} "
                                     f"recording rules) in {len(groups)} groups.")
    text = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    for name, body in counts.items():
        assert f"<!-- {name} -->{body}<!-- /{name} -->" in text, "run: python3 alerts/generate.py"


def test_stale_counts_are_rewritten_and_other_spans_left_alone() -> None:
    text = ("The set is <!-- rule-counts -->127 rules in 17 groups<!-- /rule-counts -->, "
            "<!-- other -->kept<!-- /other -->")
    rewritten = with_doc_counts(text, {"rule-counts": "The set is 3 rules."})
    assert rewritten == "The set is <!-- rule-counts -->The set is 3 rules.<!-- /rule-counts -->, " \
                        "<!-- other -->kept<!-- /other -->"
