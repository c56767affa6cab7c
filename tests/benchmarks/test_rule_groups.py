"""The rule-group projection (#27 item 2): its report is current, its arithmetic counts every rule once."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import rule_groups


def test_the_committed_report_projects_the_shipped_rules() -> None:
    run = rule_groups.load_run()
    expected = rule_groups.render(run, rule_groups.project(run))
    assert rule_groups.REPORT.read_text(encoding="utf-8") == expected, (
        "docs/benchmarks-rule-groups.md is out of date: run `python3 benchmarks/rule_groups.py`")


def test_on_the_run_a_group_takes_about_the_sum_of_its_rules() -> None:
    checks = rule_groups.method_check(rule_groups.load_run())
    assert len(checks) == 17
    for group, measured, summed in checks:
        if measured >= 0.2:
            assert abs(measured / summed - 1) < 0.25, group


def test_each_rule_is_charged_once_per_rule_and_an_unknown_one_is_named(tmp_path: Path) -> None:
    # Two looks at a run: "a" one rule, "b" two (an alert with two severities), "c" two rules of different cost.
    run = [{"nodes": 8, "groups": {"g": {
        "evaluations": {"1": 1.0, "2": 1.2},
        "rule_seconds": {"a": [0.1, 0.3], "b": [0.2, 0.2, 0.2, 0.2], "c": [0.1, 0.5, 0.1, 0.5]},
    }}}]
    (tmp_path / "run.json").write_text(json.dumps(run))
    (tmp_path / "rules.yml").write_text(json.dumps({"groups": [
        {"name": "g", "rules": [{"record": "a"}, {"alert": "b"}, {"alert": "b"}, {"record": "c"}, {"record": "c"}]},
        {"name": "h", "interval": "15s", "rules": [{"record": "a"}, {"alert": "new"}]},
    ]}))
    loaded = rule_groups.load_run(tmp_path / "run.json")
    assert sorted(loaded.group_rules["g"]) == ["a", "b", "b", "c", "c"]
    g, h = rule_groups.project(loaded, tmp_path / "rules.yml")
    assert round(g.seconds, 6) == round(0.2 + 2 * 0.2 + 2 * 0.3, 6) and g.measured == 1.1
    assert round(h.seconds, 6) == 0.2 and h.unknown == ("new",) and h.measured is None
    assert rule_groups.method_check(loaded) == [("g", 1.1, g.seconds)]
