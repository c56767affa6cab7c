"""Grafana's dashboard model accepts the committed dashboards, and they follow fleetscope's rules.

No JSON Schema for the classic dashboard model is published on PyPI or npm
(``@grafana/schema`` ships TypeScript types only), so acceptance is checked
two ways: a lossless round trip through grafana-foundation-sdk's typed
``Dashboard`` model (which Grafana generates from its own schema), and
structural checks of what Grafana needs to lay out and query the panels.
"""

from __future__ import annotations

import copy
import itertools
import re
import warnings
from typing import Any

import pytest

from fleetscope import dashboards
from tests.dashboards import require_module

COMMITTED = dashboards.load()
UIDS = list(COMMITTED)
GRID_COLUMNS = 24
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__range_s", "__url_time_range", "__field", "__data",
                     "__value", "__series"}
REQUIRED_VARIABLES = {
    "fleetscope-fleet": ["datasource", "cluster"],
    "fleetscope-node": ["datasource", "cluster", "instance", "gpu"],
    "fleetscope-job": ["datasource", "cluster", "training_job"],
    "fleetscope-gpu-health": ["datasource", "cluster", "instance", "gpu"],
    "fleetscope-efa": ["datasource", "cluster", "instance"],
}


def panels(data: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dashboards.iter_panels(data))


def visual_panels(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in panels(data) if p["type"] != "row"]


def sdk_round_trip(data: dict[str, Any]) -> dict[str, Any]:
    require_module("grafana_foundation_sdk")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from grafana_foundation_sdk.models.dashboard import Dashboard

    from fleetscope.dashboards.kit import encode

    return encode(Dashboard.from_json(copy.deepcopy(data)))


def test_stable_uids() -> None:
    assert UIDS == ["fleetscope-fleet", "fleetscope-node", "fleetscope-job", "fleetscope-gpu-health", "fleetscope-efa"]
    for uid, data in COMMITTED.items():
        assert data["uid"] == uid
    assert len({d["title"] for d in COMMITTED.values()}) == len(COMMITTED)


@pytest.mark.parametrize("uid", UIDS)
def test_sdk_model_round_trip_is_lossless(uid: str) -> None:
    assert sdk_round_trip(COMMITTED[uid]) == COMMITTED[uid]


def test_round_trip_detects_a_field_grafana_does_not_know() -> None:
    data = copy.deepcopy(COMMITTED["fleetscope-fleet"])
    data["refreshEvery"] = "30s"  # not a dashboard field
    assert sdk_round_trip(data) != data


@pytest.mark.parametrize("uid", UIDS)
def test_classic_model_header(uid: str) -> None:
    data = COMMITTED[uid]
    # Classic JSON, loadable by file provisioning and the sidecar; Grafana migrates older versions forward.
    assert isinstance(data["schemaVersion"], int) and 36 <= data["schemaVersion"] <= 42
    assert data["title"].startswith("fleetscope / ")
    assert "fleetscope" in data["tags"]
    assert data["time"]["from"].startswith("now-")
    assert "id" not in data  # instance-local; provisioning assigns it


@pytest.mark.parametrize("uid", UIDS)
def test_panel_titles_unique(uid: str) -> None:
    titles = [p["title"] for p in panels(COMMITTED[uid])]
    assert len(titles) == len(set(titles)), "a title names one panel, for links, tests and readers"


@pytest.mark.parametrize("uid", UIDS)
def test_panel_ids_unique_and_positive(uid: str) -> None:
    ids = [p["id"] for p in panels(COMMITTED[uid])]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("uid", UIDS)
def test_grid_positions_fit_and_do_not_overlap(uid: str) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in panels(COMMITTED[uid]):
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["y"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= GRID_COLUMNS, f"{panel['title']} overflows the grid"
        columns, rows = range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
        cells = {(x, y) for x in columns for y in rows}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


@pytest.mark.parametrize("uid", UIDS)
def test_rows_are_open_and_carry_no_panels(uid: str) -> None:
    rows = [p for p in COMMITTED[uid]["panels"] if p["type"] == "row"]
    assert rows, "dashboards are organised in rows"
    for row in rows:
        # Grafana drops panels nested inside an expanded row.
        assert not row.get("collapsed") and not row.get("panels"), row["title"]
    assert COMMITTED[uid]["panels"][0]["type"] == "row"


@pytest.mark.parametrize("uid", UIDS)
def test_every_panel_has_unit_thresholds_and_the_datasource_variable(uid: str) -> None:
    for panel in visual_panels(COMMITTED[uid]):
        title = panel["title"]
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults.get("unit"), f"{title}: no unit"
        steps = defaults["thresholds"]["steps"]
        assert steps and steps[0]["value"] is None, f"{title}: thresholds need a base step"
        values = [s["value"] for s in steps[1:]]
        assert all(a < b for a, b in itertools.pairwise(values)), f"{title}: threshold steps not strictly rising"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title


@pytest.mark.parametrize("uid", UIDS)
def test_every_target_has_an_expression_and_a_unique_ref_id(uid: str) -> None:
    for panel in visual_panels(COMMITTED[uid]):
        targets = panel["targets"]
        assert targets, f"{panel['title']}: no query"
        ref_ids = [t["refId"] for t in targets]
        assert len(set(ref_ids)) == len(ref_ids)
        for target in targets:
            assert target["expr"].strip()
            assert target.get("datasource", panel["datasource"]) == panel["datasource"]


@pytest.mark.parametrize("uid", UIDS)
def test_variables(uid: str) -> None:
    variables = COMMITTED[uid]["templating"]["list"]
    names = [v["name"] for v in variables]
    assert names[: len(REQUIRED_VARIABLES[uid])] == REQUIRED_VARIABLES[uid]
    datasource = variables[0]
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    for variable in variables[1:]:
        assert variable["type"] == "query"
        assert variable["datasource"]["uid"] == "${datasource}"
        assert variable["query"].startswith("label_values(")
        if variable.get("includeAll"):
            assert variable["allValue"] == ".*", variable["name"]


@pytest.mark.parametrize("uid", UIDS)
def test_annotations_query_the_datasource_variable(uid: str) -> None:
    for mark in COMMITTED[uid].get("annotations", {}).get("list", []):
        assert mark["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, mark["name"]
        assert mark["expr"].strip() and mark["titleFormat"] and mark["enable"] is True


def test_training_job_variable_lists_jobs_from_the_steps_counter() -> None:
    (variable,) = [v for v in COMMITTED["fleetscope-job"]["templating"]["list"] if v["name"] == "training_job"]
    assert re.fullmatch(r"label_values\(fleetscope_training_steps_total(\{[^}]*\})?, training_job\)", variable["query"])


@pytest.mark.parametrize("uid", UIDS)
def test_queries_only_use_defined_variables(uid: str) -> None:
    data = COMMITTED[uid]
    defined = {v["name"] for v in data["templating"]["list"]}
    texts = [t["expr"] for p in visual_panels(data) for t in p["targets"]]
    texts += [v["query"] for v in data["templating"]["list"] if v["type"] == "query"]
    texts += [mark["expr"] for mark in data.get("annotations", {}).get("list", [])]
    for text in texts:
        for braced, bare in re.findall(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", text):
            name = braced or bare
            assert name in defined | BUILTIN_VARIABLES, f"{uid}: ${name} is not defined"


@pytest.mark.parametrize("uid", UIDS)
def test_multi_value_variables_are_matched_as_regex(uid: str) -> None:
    for panel in visual_panels(COMMITTED[uid]):
        for target in panel["targets"]:
            assert not re.search(r'[^=!]=\s*"\$', target["expr"]), f"{panel['title']}: use =~ with variables"


def links_of(data: dict[str, Any]) -> list[str]:
    urls = [link.get("url", "") for link in data.get("links", [])]
    for panel in visual_panels(data):
        urls += [link["url"] for link in panel["fieldConfig"]["defaults"].get("links", [])]
    return urls


def test_links_lead_fleet_to_node_to_job_and_back() -> None:
    def targets(uid: str) -> set[str]:
        return {m for url in links_of(COMMITTED[uid]) for m in re.findall(r"^/d/([\w-]+)", url)}

    assert {"fleetscope-node", "fleetscope-job"} <= targets("fleetscope-fleet")
    assert "fleetscope-job" in targets("fleetscope-node")
    assert "fleetscope-node" in targets("fleetscope-job")
    assert "fleetscope-node" in targets("fleetscope-gpu-health")
    assert "fleetscope-node" in targets("fleetscope-efa")


@pytest.mark.parametrize("uid", UIDS)
def test_links_point_at_shipped_dashboards_and_keep_context(uid: str) -> None:
    data = COMMITTED[uid]
    for url in links_of(data):
        if not url:
            continue
        target = re.match(r"^/d/([\w-]+)", url)
        assert target and target.group(1) in COMMITTED, url
        assert "${__url_time_range}" in url and "${datasource:queryparam}" in url, url
        variable = re.search(r"var-(\w+)=", url)
        assert variable and variable.group(1) in {v["name"] for v in COMMITTED[target.group(1)]["templating"]["list"]}
    tag_links = [link for link in data["links"] if link["type"] == "dashboards"]
    assert tag_links and tag_links[0]["tags"] == ["fleetscope"]


def test_table_field_references_exist() -> None:
    """Renames, sorts and overrides name columns that the queries produce."""
    for uid, data in COMMITTED.items():
        for panel in visual_panels(data):
            if panel["type"] != "table":
                continue
            ref_ids = [t["refId"] for t in panel["targets"]]
            produced = {"Value"} if len(ref_ids) == 1 else {f"Value #{r}" for r in ref_ids}
            transformations = {t["id"]: t["options"] for t in panel["transformations"]}
            renames = transformations["organize"]["renameByName"]
            value_renames = {k: v for k, v in renames.items() if k.startswith("Value")}
            assert set(value_renames) <= produced, f"{uid}/{panel['title']}: renames unknown columns"
            columns = set(value_renames.values()) | (produced - set(value_renames)) | set(renames.values())
            for override in panel["fieldConfig"]["overrides"]:
                assert override["matcher"]["options"] in columns, f"{uid}/{panel['title']}: {override}"
            if "sortBy" in transformations:
                assert transformations["sortBy"]["sort"][0]["field"] in columns
            if len(ref_ids) > 1:
                assert next(iter(transformations)) == "merge"
                assert all(t.get("format") == "table" for t in panel["targets"])
