"""Every panel query returns data from a real Prometheus fed by the simulated cluster.

Set FLEETSCOPE_E2E_PROMETHEUS to that Prometheus's base URL (for example
``http://127.0.0.1:9090`` of ``fleetscope demo``, after its faults have fired)
to run it; without it the module is skipped. Dashboard variables take the
values of :data:`fleetscope.dashboards.QUERY_DEFAULTS` (regexes match all,
``$__rate_interval`` is 1m).
"""

from __future__ import annotations

import os

import pytest

from fleetscope.dashboards import PanelQuery, queries

# Read at import: the suite's autouse fixture clears FLEETSCOPE_* variables before each test runs.
PROMETHEUS_URL = os.environ.get("FLEETSCOPE_E2E_PROMETHEUS", "").rstrip("/")

if not PROMETHEUS_URL:
    pytest.skip("FLEETSCOPE_E2E_PROMETHEUS is not set", allow_module_level=True)

ALL_QUERIES = queries()


@pytest.fixture(scope="module")
def client():
    import httpx

    with httpx.Client(base_url=PROMETHEUS_URL, timeout=30.0) as http:
        yield http


@pytest.mark.e2e
@pytest.mark.parametrize("query", ALL_QUERIES, ids=lambda q: f"{q.dashboard}/{q.panel}/{q.ref_id}")
def test_panel_query_returns_data(client, query: PanelQuery) -> None:
    response = client.post("/api/v1/query", data={"query": query.expr})
    body = response.json()
    assert response.status_code == 200 and body.get("status") == "success", (
        f"{query.dashboard} / {query.panel}: Prometheus refused the query: {body.get('error')}\n{query.expr}"
    )
    result = body["data"]["result"]
    assert result, f"{query.dashboard} / {query.panel} ({query.ref_id}) returned no data:\n{query.expr}"


@pytest.mark.e2e
def test_annotation_queries_are_accepted(client) -> None:
    """Annotations mark events (Xids, firing alerts) and may be empty, but Prometheus must accept them."""
    from fleetscope.dashboards import load, substitute

    for uid, data in load().items():
        for mark in data.get("annotations", {}).get("list", []):
            body = client.post("/api/v1/query", data={"query": substitute(mark["expr"])}).json()
            assert body.get("status") == "success", f"{uid} / {mark['name']}: {body.get('error')}"
