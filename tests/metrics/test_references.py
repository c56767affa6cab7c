"""Rules and dashboards reference only what exists: contract metrics and recording rules the rule files record.

One check for both. Every PromQL expression (alerting and recording rules,
dashboard panels, annotations, template variables) is parsed with a PromQL
parser and its selectors' names collected; the Go templates of alerts
(summaries, descriptions, which query the TSDB through ``printf``) are
scanned for names. A name must be a metric of :mod:`fleetscope.metrics`, a
recording rule one of the generated files in ``alerts/`` records, or a series
Prometheus makes itself. A renamed metric or a misspelled recording rule
fails here, before it reaches a dashboard that shows "No data".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from fleetscope import dashboards, metrics, promql
from fleetscope.dashboards import queries, substitute
from tests.alerts.rulefiles import ALERTS_DIR
from tests.dashboards import require_module

promql_parser = require_module("promql_parser")

# Series Prometheus writes itself: target health and the alerts' own state.
PROMETHEUS_SERIES = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})
RECORDING_NAME = re.compile(r"(?<![\w:])[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")
METRIC_NAME = re.compile(r"(?<![\w:])fleetscope_[a-z0-9_]+\b(?!:)")


@dataclass(frozen=True)
class Reference:
    where: str  # "alerts/fleetscope.rules.yml: GpuLost", "fleetscope-node / GPU utilization"
    names: frozenset[str]


def selector_names(expr: str) -> set[str]:
    """Metric names of every selector in a PromQL expression (walks the parsed tree)."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)
            return
        if isinstance(node, promql_parser.MatrixSelector):
            walk(node.vector_selector)
            return
        for attr in ("expr", "lhs", "rhs", "param"):
            child = getattr(node, attr, None)
            if child is not None:
                walk(child)
        for child in getattr(node, "args", None) or []:
            walk(child)

    walk(promql_parser.parse(expr))
    return names


def template_names(text: str) -> set[str]:
    """Recording rules and fleetscope metrics named in a Go template (or any text)."""
    recorded = set(RECORDING_NAME.findall(text))
    return recorded | set(METRIC_NAME.findall(RECORDING_NAME.sub(" ", text)))


# -- what the rules and dashboards reference ----------------------------------------------------------


def rule_documents() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(file, groups) of every generated rule file; a PrometheusRule carries its groups in ``spec``."""
    for path in sorted(ALERTS_DIR.glob("*.y*ml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(document, dict):
                groups = (document.get("spec") or document).get("groups")
                if groups:
                    yield f"alerts/{path.name}", groups


def recorded_names() -> frozenset[str]:
    """Every recording rule the generated rule files define."""
    return frozenset(
        rule["record"] for _, groups in rule_documents() for group in groups for rule in group["rules"]
        if "record" in rule
    )


def rule_references() -> list[Reference]:
    out = []
    for file, groups in rule_documents():
        for group in groups:
            for rule in group["rules"]:
                where = f"{file}: {rule.get('alert') or rule.get('record')}"
                texts = [*rule.get("annotations", {}).values(), *rule.get("labels", {}).values()]
                names = selector_names(rule["expr"]).union(*(template_names(t) for t in texts))
                out.append(Reference(where, frozenset(names)))
    return out


def dashboard_references() -> list[Reference]:
    out = [Reference(f"{q.dashboard} / {q.panel} / {q.ref_id}", frozenset(selector_names(q.expr))) for q in queries()]
    for uid, data in dashboards.load().items():
        marks = [mark for mark in data.get("annotations", {}).get("list", []) if "expr" in mark]
        out += [
            Reference(f"{uid} / annotation {mark['name']}", frozenset(selector_names(substitute(mark["expr"]))))
            for mark in marks
        ]
        for variable in data["templating"]["list"]:
            if variable["type"] == "query":
                inner = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"])
                assert inner, variable["query"]
                names = selector_names(substitute(inner.group(1)))
                out.append(Reference(f"{uid} / variable {variable['name']}", frozenset(names)))
    return out


def undefined(references: Iterable[Reference], recorded: frozenset[str]) -> dict[str, str]:
    """Name -> first place it is used, for every name neither the contract nor the rule files define."""
    known = metrics.BY_NAME.keys() | recorded | PROMETHEUS_SERIES
    out: dict[str, str] = {}
    for reference in references:
        for name in sorted(reference.names - known):
            out.setdefault(name, reference.where)
    return out


# -- the check ------------------------------------------------------------------------------------------


def test_rules_and_dashboards_reference_only_defined_names() -> None:
    rules, panels, recorded = rule_references(), dashboard_references(), recorded_names()
    assert len(rules) > 100 and len(panels) > 100 and len(recorded) > 15
    used = set().union(*(r.names for r in rules + panels))
    assert len(used & metrics.BY_NAME.keys()) > 60, "the extraction finds too few metrics: it is broken"
    assert used & recorded, "no recording rule is read: the extraction is broken"
    annotated = {r.where.split(" / ")[0] for r in panels if " / annotation " in r.where}
    assert annotated >= {"fleetscope-node", "fleetscope-job", "fleetscope-gpu-health"}
    assert sum(" / variable " in r.where for r in panels) >= 5
    assert undefined(rules + panels, recorded) == {}


def test_a_misspelled_metric_fails_the_check() -> None:
    """Misspell one metric in a real alert, a real panel and a real alert template: each is reported."""
    recorded = recorded_names()
    real_rule = next(r for r in rule_references() if str(metrics.training.LAST_STEP_TIMESTAMP_SECONDS) in r.names)
    real_panel = next(r for r in dashboard_references() if str(metrics.efa.RETRANSMIT_PACKETS_TOTAL) in r.names)
    typo_rule = Reference(real_rule.where, frozenset(selector_names(
        "time() - max by (training_job) (fleetscope_training_last_step_timestmp_seconds)")))
    typo_panel = Reference(real_panel.where, frozenset(selector_names(
        'sum by (instance) (rate(fleetscope_efa_retransmit_packet_total{cluster=~".*"}[1m]))')))
    typo_template = Reference("template", frozenset(template_names(
        "{{ with printf `fleetscope_efa_expected_device{instance=%q}` $labels.instance | query }}{{ end }}")))
    assert undefined([real_rule, real_panel], recorded) == {}
    assert undefined([typo_rule, typo_panel, typo_template], recorded) == {
        "fleetscope_training_last_step_timestmp_seconds": real_rule.where,
        "fleetscope_efa_retransmit_packet_total": real_panel.where,
        "fleetscope_efa_expected_device": "template",
    }


def test_a_misspelled_or_unrecorded_recording_rule_fails_the_check() -> None:
    recorded = recorded_names()
    misspelled = promql.RANK_COMPUTE_RATIO.replace("ratio_stage_median", "ratio_stage_mean")
    references = [Reference("panel", frozenset(selector_names(f"topk(5, {misspelled})")))]
    assert undefined(references, recorded) == {misspelled: "panel"}
    # a name of the vocabulary counts only once a rule file records it
    assert undefined(references, recorded | {misspelled}) == {}


# -- extraction -----------------------------------------------------------------------------------------


def test_selector_names_walks_the_whole_tree() -> None:
    expr = ('sum by (a) (rate(m1{x=~".*"}[1m])) / on (a) group_left () topk(3, m2) '
            'or label_replace(max_over_time(m3[5m:1m]), "b", "$1", "a", "(.*)") and -m4 > bool 2 * vector(0)')
    assert selector_names(expr) == {"m1", "m2", "m3", "m4"}


def test_template_names_separate_recording_rules_from_metrics() -> None:
    names = template_names("{{ $value }} of rate(fleetscope_a_total[5m]) / on (x) instance:fleetscope_b:rate")
    assert names == {"instance:fleetscope_b:rate", "fleetscope_a_total"}
