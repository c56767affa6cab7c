"""Every dashboard query is valid PromQL (the names it reads are checked in tests/metrics/test_references.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from fleetscope import dashboards
from fleetscope.dashboards import QUERY_DEFAULTS, PanelQuery, queries, substitute
from tests.conftest import require_binary
from tests.dashboards import require_module

promql_parser = require_module("promql_parser")

ALL = queries()


# -- annotations -------------------------------------------------------------------------------------


def annotation_exprs() -> list[tuple[str, str]]:
    return [(uid, mark["expr"]) for uid, data in dashboards.load().items()
            for mark in data.get("annotations", {}).get("list", []) if "expr" in mark]


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
    assert by_key[("fleetscope-fleet", "Flagged stragglers and their cause")].instant
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
