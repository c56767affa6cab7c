"""Every dashboard query is valid PromQL over metrics fleetscope (or its rules) produce."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetscope import dashboards
from fleetscope.dashboards import QUERY_DEFAULTS, PanelQuery, queries, substitute
from tests.conftest import ROOT, require_binary
from tests.dashboards import require_module

promql_parser = require_module("promql_parser")

ALL = queries()
# Series Prometheus itself produces; dashboards may read them.
PROMETHEUS_BUILTINS = {"ALERTS"}


# -- metric names -----------------------------------------------------------------------------------


def metric_names(expr: str) -> set[str]:
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


def test_metric_names_walks_the_whole_tree() -> None:
    expr = ('sum by (a) (rate(m1{x=~".*"}[1m])) / on (a) group_left () topk(3, m2) '
            'or label_replace(max_over_time(m3[5m:1m]), "b", "$1", "a", "(.*)") and -m4 > bool 2 * vector(0)')
    assert metric_names(expr) == {"m1", "m2", "m3", "m4"}


def _expand(token: str) -> set[str]:
    """``fleetscope_efa_{tx,rx}_bytes_total`` -> both names; a trailing ``{labels}`` is dropped."""
    match = re.search(r"\{([^}]*)\}", token)
    if not match:
        return {token}
    if match.end() == len(token):  # trailing label list
        return {token[: match.start()]}
    head, tail = token[: match.start()], token[match.end():]
    return set().union(*(_expand(head + alt + tail) for alt in match.group(1).split(",")))


def test_expand_design_notation() -> None:
    assert _expand("fleetscope_efa_{tx,rx}_bytes_total") == {
        "fleetscope_efa_tx_bytes_total", "fleetscope_efa_rx_bytes_total"}
    assert _expand("fleetscope_gpu_clock_hertz{gpu,uuid,clock}") == {"fleetscope_gpu_clock_hertz"}
    assert _expand("fleetscope_net_{receive,transmit}_{bytes,packets}_total") == {
        "fleetscope_net_receive_bytes_total", "fleetscope_net_receive_packets_total",
        "fleetscope_net_transmit_bytes_total", "fleetscope_net_transmit_packets_total"}


def catalog_names() -> tuple[set[str], str]:
    """The metric catalog: docs/metrics.md once generated, else the binding names of docs/design.md."""
    catalog = Path(ROOT, "docs", "metrics.md")
    if catalog.is_file():
        return set(re.findall(r"^\| `(fleetscope_\w+)` \|", catalog.read_text(), re.MULTILINE)), str(catalog)
    design = Path(ROOT, "docs", "design.md").read_text()
    section = design[design.index("## Metric names"):]
    names: set[str] = set()
    for token in re.findall(r"`(fleetscope_[^`]*)`", section):
        for name in _expand(token.split(" ")[0]):
            names.add(name)
    return names, "docs/design.md"


def _rule_groups(data: Any) -> Iterator[dict[str, Any]]:
    if isinstance(data, dict):
        if isinstance(data.get("groups"), list):
            yield from data["groups"]
        for value in data.values():
            if isinstance(value, dict):
                yield from _rule_groups(value)


def recorded_names() -> set[str]:
    names: set[str] = set()
    for path in sorted(Path(ROOT, "alerts").glob("*.y*ml")):
        for document in yaml.safe_load_all(path.read_text()):
            for group in _rule_groups(document):
                names.update(rule["record"] for rule in group.get("rules", []) if "record" in rule)
    return names


def test_every_metric_a_dashboard_uses_is_in_the_catalog() -> None:
    catalog, source = catalog_names()
    assert len(catalog) > 100, f"could not read the metric names from {source}"
    known = catalog | recorded_names() | PROMETHEUS_BUILTINS
    unknown = {}
    for query in ALL:
        for name in metric_names(query.expr) - known:
            unknown.setdefault(name, f"{query.dashboard} / {query.panel}")
    assert not unknown, f"metrics not in {source} nor recorded by alerts/: {unknown}"


def annotation_exprs() -> list[tuple[str, str]]:
    return [(uid, mark["expr"]) for uid, data in dashboards.load().items()
            for mark in data.get("annotations", {}).get("list", []) if "expr" in mark]


def test_annotations_parse_and_use_catalog_metrics() -> None:
    catalog, source = catalog_names()
    marks = annotation_exprs()
    assert {uid for uid, _ in marks} >= {"fleetscope-node", "fleetscope-job", "fleetscope-gpu-health"}
    for uid, expr in marks:
        assert metric_names(substitute(expr)) <= catalog | PROMETHEUS_BUILTINS, f"{uid}: {expr} ({source})"


def test_variable_queries_use_catalog_metrics() -> None:
    catalog, source = catalog_names()
    for uid, data in dashboards.load().items():
        for variable in data["templating"]["list"]:
            if variable["type"] != "query":
                continue
            inner = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"])
            assert inner, variable["query"]
            assert metric_names(substitute(inner.group(1))) <= catalog, f"{uid}: {variable['query']} ({source})"


# -- queries() ----------------------------------------------------------------------------------------


def test_queries_cover_every_target_of_every_panel() -> None:
    expected = sum(len(p.get("targets", [])) for d in dashboards.load().values() for p in dashboards.iter_panels(d))
    assert len(ALL) == expected > 50
    assert {q.dashboard for q in ALL} == set(dashboards.DASHBOARD_MODULES)
    keys = [(q.dashboard, q.panel, q.ref_id) for q in ALL]
    assert len(keys) == len(set(keys))


def test_queries_have_no_variables_left() -> None:
    for query in ALL:
        assert "$" not in query.expr, query
        assert substitute(query.template) == query.expr


def test_substitute_forms_and_unknown_variables() -> None:
    assert substitute('rate(m{instance=~"$instance"}[$__rate_interval])') == 'rate(m{instance=~".*"}[1m])'
    assert substitute("${gpu} ${cluster:regex}") == ".* .*"
    assert substitute("$instance", {"instance": "node-1"}) == "node-1"
    with pytest.raises(KeyError):
        substitute("$nope")
    assert QUERY_DEFAULTS["__rate_interval"] == "1m"


def test_instant_flag_follows_the_target() -> None:
    by_key = {(q.dashboard, q.panel): q for q in ALL}
    assert by_key[("fleetscope-fleet", "Worst stragglers")].instant
    assert not by_key[("fleetscope-node", "GPU utilization")].instant


def test_queries_accept_explicit_dashboards() -> None:
    fake = {"x": {"panels": [{"type": "row", "title": "r", "panels": [
        {"title": "p", "targets": [{"refId": "A", "expr": 'up{instance=~"$instance"}', "instant": True}]}]}]}}
    assert queries(fake) == [PanelQuery("x", "p", "A", 'up{instance=~".*"}', 'up{instance=~"$instance"}', True)]


# -- syntax -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ALL, ids=lambda q: f"{q.dashboard}/{q.panel}/{q.ref_id}")
def test_query_parses(query: PanelQuery) -> None:
    promql_parser.parse(query.expr)


def test_prometheus_parser_accepts_every_query(tmp_path: Path) -> None:
    """promtool parses each query with Prometheus's own parser (as recording rules in a throwaway file)."""
    promtool = require_binary("promtool")
    exprs = [q.expr for q in ALL] + [substitute(expr) for _, expr in annotation_exprs()]
    rules = [{"record": f"dashboard:query_{i}:check", "expr": expr} for i, expr in enumerate(exprs)]
    path = tmp_path / "queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout
