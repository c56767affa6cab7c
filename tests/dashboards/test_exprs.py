"""The dashboards show what the rules decide, read from the same recording rules.

A straggler's cause is decided once, by the recording rule
:data:`fleetscope.promql.STRAGGLER_CAUSE`: the TrainingStragglerRank alert
takes its ``cause`` label from it and the dashboards' straggler tables query
it, so an alert and a panel can never name different causes for one rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fleetscope import dashboards
from fleetscope.dashboards import exprs, substitute
from fleetscope.promql import (
    JOB_STRAGGLER_CAUSES,
    NODE_SLOWDOWN_CAUSES,
    RANK_COMPUTE_RATIO_SMOOTHED,
    STRAGGLER_CAUSE,
    STRAGGLER_CAUSES,
)
from fleetscope_sim.virtual import promtool_test_rules
from tests.alerts.rulefiles import iter_rules, load_groups
from tests.conftest import require_binary
from tests.dashboards import require_module
from tests.metrics.test_references import selector_names

promql_parser = require_module("promql_parser")

MATCHERS = substitute('cluster=~"$cluster", training_job=~"$training_job"')
RULES = list(iter_rules(load_groups("fleetscope.rules.yml")))
QUERIES = dashboards.queries()


def selectors(expr: str) -> set[str]:
    """Names of every series selector in ``expr`` (a query's variables already substituted)."""
    return selector_names(expr)


def test_the_straggler_alert_and_the_dashboards_read_one_cause_recording_rule() -> None:
    straggler_alerts = [r for r in RULES if r.get("alert") == "TrainingStragglerRank"]
    assert {r["labels"]["severity"] for r in straggler_alerts} == {"warning", "critical"}
    for rule in straggler_alerts:
        assert selectors(rule["expr"]) == {STRAGGLER_CAUSE}, rule["expr"]
        assert "$labels.cause" in rule["annotations"]["description"]
    tables = [q for q in QUERIES if "flagged" in q.panel.lower() and "cause" in q.panel.lower()]
    assert {q.dashboard for q in tables} == {"fleetscope-job", "fleetscope-fleet"}
    for query in tables:
        assert selectors(query.expr) & {STRAGGLER_CAUSE, JOB_STRAGGLER_CAUSES}, (query.panel, query.expr)


def test_the_cause_is_decided_in_one_recording_rule() -> None:
    """Only the verdict writes a straggler's `cause`; its job count aggregates it, the evidence feeds it,
    and no dashboard query labels a cause of its own."""
    writers = {r.get("record") or r.get("alert") for r in RULES if "cause" in r.get("labels", {})}
    assert writers == {STRAGGLER_CAUSE, NODE_SLOWDOWN_CAUSES, "training_job:fleetscope_training_lost_gpu_seconds:rate"}
    assert not [r for r in RULES if '"cause"' in r["expr"] and "label_replace" in r["expr"]]
    verdict = [r["labels"]["cause"] for r in RULES if r.get("record") == STRAGGLER_CAUSE]
    assert verdict == list(STRAGGLER_CAUSES)  # one rule per cause, in the order the verdict tests them
    for query in QUERIES:
        assert "label_replace" not in query.expr, (query.dashboard, query.panel)


def test_straggler_panels_read_the_statistic_the_rule_judges() -> None:
    """No dashboard recomputes the stage ratio from the raw medians: the panels read the smoothed ratio."""
    raw = "fleetscope_training_compute_seconds_median"
    for query in QUERIES:
        assert raw not in selectors(query.expr), (query.dashboard, query.panel)
    readers = {(q.dashboard, q.panel) for q in QUERIES if RANK_COMPUTE_RATIO_SMOOTHED in selectors(q.expr)}
    assert {d for d, _ in readers} == {"fleetscope-job", "fleetscope-fleet"}


def test_cause_mappings_cover_every_cause() -> None:
    assert set(exprs.cause_mappings()) == set(STRAGGLER_CAUSES)
    assert all(text.startswith(cause) for cause, (text, _) in exprs.cause_mappings().items())


def test_mean_step_seconds(tmp_path: Path) -> None:
    require_binary("promtool")
    labels = 'training_job="j", pp_stage="0", rank="0", local_rank="0", instance="n1"'
    series: list[dict[str, Any]] = [
        {"series": f"fleetscope_training_steps_total{{{labels}}}", "values": "0+1x15"},
        {"series": f"fleetscope_training_step_seconds_total{{{labels}}}", "values": "0+60x15"},
    ]
    (tmp_path / "empty.rules.yml").write_text("groups: []\n")
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["empty.rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": exprs.mean_step_seconds(MATCHERS, "training_job"), "eval_time": "10m",
            "exp_samples": [{"labels": '{training_job="j"}', "value": 60}]}]}],
    }))
    result = promtool_test_rules("test.yml", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
