"""The push routes in-process (FastAPI TestClient): status codes, messages, nothing stored on refusal."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request

from fleetscope.collectors.steps import StepsCollector
from fleetscope.config import load
from fleetscope.push.api import InflightBudget, PushRefused
from fleetscope.serve.daemon import build_daemon


def make_client(**flags: object) -> tuple[TestClient, StepsCollector]:
    config = load(flags={f"push.{k.replace('_', '-')}": v for k, v in flags.items()}, environ={})
    collector = StepsCollector(config)
    return TestClient(build_daemon(config, collectors={"steps": collector}).app), collector


def record(rank: int = 0, step: int = 0, job: str = "j", **extra: object) -> dict[str, object]:
    return {"job": job, "rank": rank, "step": step, "step_seconds": 1.0, **extra}


def test_push_one_and_a_batch() -> None:
    client, collector = make_client()
    assert client.post("/api/v1/steps", json=record()).json() == {"accepted": 1}
    assert client.post("/api/v1/steps", json=[record(rank=r) for r in range(3)]).json() == {"accepted": 3}
    view = collector.store.view()
    assert view.records_total == 4 and len(view.ranks) == 3


def test_invalid_record_answers_422_naming_the_field_and_stores_nothing() -> None:
    client, collector = make_client()
    client.post("/api/v1/steps", json=record())
    response = client.post("/api/v1/steps", json=[record(rank=1), record(rank=2, step_seconds=-1)])
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "body[1].step_seconds"
    view = collector.store.view()
    assert view.records_total == 1 and view.rejected == {"invalid": 1}


def test_declared_oversized_body_answers_413() -> None:
    client, collector = make_client(max_body_bytes=1000)
    body = json.dumps([record(rank=r) for r in range(50)])
    response = client.post("/api/v1/steps", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "max-body-bytes" in response.json()["detail"]
    assert collector.store.view().records_total == 0


def test_undeclared_oversized_stream_answers_413() -> None:
    client, collector = make_client(max_body_bytes=1000)

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
        yield b"["
        for rank in range(50):
            yield json.dumps(record(rank=rank)).encode() + b","
        yield json.dumps(record()).encode() + b"]"

    response = client.post("/api/v1/steps", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert collector.store.view().records_total == 0
    assert collector.store.view().rejected == {"too_large": 1}


def test_limits_answer_429_and_leave_the_store_unchanged() -> None:
    client, collector = make_client(max_jobs=1, max_ranks=2)
    assert client.post("/api/v1/steps", json=[record(rank=0), record(rank=1)]).status_code == 200
    response = client.post("/api/v1/steps", json=[record(rank=0, step=1), record(rank=2)])
    assert response.status_code == 429 and "max-ranks" in response.json()["detail"]
    response = client.post("/api/v1/steps", json=record(job="other"))
    assert response.status_code == 429 and "max-jobs" in response.json()["detail"]
    view = collector.store.view()
    assert view.records_total == 2 and {r.values["steps"] for r in view.ranks} == {1}
    assert view.rejected == {"limit": 2}


def test_token_is_required_when_configured() -> None:
    client, collector = make_client(token="s3cret")
    assert client.post("/api/v1/steps", json=record()).status_code == 401
    wrong = client.post("/api/v1/steps", json=record(), headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer")
    assert client.delete("/api/v1/jobs/j").status_code == 401
    assert client.put("/metrics/job/x", content="m 1\n").status_code == 401
    ok = client.post("/api/v1/steps", json=record(), headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert collector.store.view().rejected == {"unauthorized": 4}


def test_a_token_written_with_a_trailing_newline_matches_at_both_ends(tmp_path) -> None:
    """#30 item 6: `echo s3cret > file` gives "s3cret\\n"; the daemon stripped the supplied token, not its own."""
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    for flags in ({"token": "s3cret\n"}, {"token_file": str(token_file)}):
        client, _ = make_client(**flags)
        for supplied in ("s3cret", "s3cret\t", " s3cret"):
            ok = client.post("/api/v1/steps", json=record(), headers={"Authorization": f"Bearer {supplied}"})
            assert ok.status_code == 200, (flags, supplied)
        assert client.post("/api/v1/steps", json=record(), headers={"Authorization": "Bearer s3cre"}).status_code == 401


def test_job_end_removes_its_series_at_once() -> None:
    client, collector = make_client()
    client.post("/api/v1/steps", json=[record(rank=0), record(rank=1), record(job="k")])
    assert client.delete("/api/v1/jobs/j").json() == {"job": "j", "ranks_removed": 2}
    assert [r.job for r in collector.store.view().ranks] == ["k"]
    assert 'training_job="j"' not in client.get("/metrics").text


def test_pushgateway_routes_status_codes() -> None:
    client, collector = make_client()
    assert client.put("/metrics/job/train/rank/0", content="m 1\n").status_code == 200
    assert client.post("/metrics/job/train/rank/0", content="n 2\n").status_code == 200
    assert client.put("/metrics/job/train/rank", content="m 1\n").status_code == 400
    assert client.put("/metrics/job/train", content="m 1 123\n").status_code == 400
    assert (
        client.put(
            "/metrics/job/train",
            content=b"\x00",
            headers={
                "content-type": "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily"
            },
        ).status_code
        == 415
    )
    groups, _ = collector.groups.view()
    assert [sorted(f.name for f in g.families) for g in groups] == [["m", "n"]]
    assert client.delete("/metrics/job/train/rank/0").status_code == 202
    assert collector.groups.view()[0] == ()


def docs_client(**flags: object) -> TestClient:
    config = load(flags=flags, environ={})
    return TestClient(build_daemon(config, collectors={"steps": StepsCollector(config)}).app)


def test_api_docs_are_off_unless_asked_for() -> None:
    """#18 item 12: /docs and /openapi.json were served to anyone, push.token or not."""
    client = docs_client(**{"push.token": "secret"})
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 404, path
    assert "API docs" not in client.get("/").text
    opted_in = docs_client(**{"web.api-docs": "true"})
    assert opted_in.get("/docs").status_code == 200
    assert opted_in.get("/openapi.json").status_code == 200


def test_openapi_documents_the_push_api() -> None:
    spec = docs_client(**{"web.api-docs": "true"}).get("/openapi.json").json()
    post = spec["paths"]["/api/v1/steps"]["post"]
    assert {"413", "422", "429", "401"} <= set(post["responses"])
    schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert {o["type"] for o in schema["anyOf"]} == {"object", "array"}
    assert "/api/v1/jobs/{job}" in spec["paths"]
    assert {"put", "post", "delete"} <= set(spec["paths"]["/metrics/{grouping}"])


def test_metrics_page_still_serves_with_push_routes_mounted() -> None:
    client, _ = make_client()
    client.post("/api/v1/steps", json=record(local_rank=0))
    text = client.get("/metrics").text
    assert 'fleetscope_training_steps_total{local_rank="0",pp_stage="",rank="0",training_job="j"} 1.0' in text


def report(rank: int = 0, **extra: object) -> dict[str, object]:
    return {"job": "j", "rank": rank, "world_size": 4, "pid": 100 + rank, "start_time": 5, **extra}


def test_report_stores_steps_and_position_and_acknowledges_resent_steps() -> None:
    client, collector = make_client()
    body = report(steps=[{"step": 1, "step_seconds": 0.5}, {"step": 2, "step_seconds": 0.5}],
                  position={"step": 3, "phase": "data", "since": 1_700_000_000.0})
    assert client.post("/api/v1/report", json=body).json() == {"accepted": 2}
    again = report(steps=[{"step": 2, "step_seconds": 0.5}, {"step": 3, "step_seconds": 0.5}])
    assert client.post("/api/v1/report", json=again).json() == {"accepted": 1, "duplicate": 1}
    (view,) = collector.store.view().ranks
    assert view.values["steps"] == 3 and view.position is not None and view.position.phase == "data"
    assert collector.store.view().rejected == {"duplicate": 1}


def test_a_heartbeat_alone_is_accepted_and_a_rank_outside_its_world_is_refused() -> None:
    client, collector = make_client()
    heartbeat = report(rank=3, position={"step": 1, "phase": "compute", "since": 1_700_000_000.0})
    assert client.post("/api/v1/report", json=heartbeat).json() == {"accepted": 0}
    response = client.post("/api/v1/report", json=report(rank=4))
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "body.rank"
    response = client.post("/api/v1/report", json=report(position={"step": 1, "phase": "lunch", "since": 1.0}))
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "body.position.phase"
    assert [r.rank for r in collector.store.view().ranks] == [3]
    assert collector.store.view().rejected == {"invalid": 2}


def test_bodies_in_flight_are_bounded() -> None:
    """#18 item 6: 100 concurrent 1 MiB pushes were all buffered at once; past the budget a push gets 503."""
    def request(length: int | None) -> Request:
        headers = [] if length is None else [(b"content-length", str(length).encode())]
        return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})

    async def scenario() -> None:
        budget = InflightBudget(3_000)
        async with budget.hold(request(2_000), 1_000_000), budget.hold(request(1_000), 1_000_000):
            with pytest.raises(PushRefused) as refused:
                async with budget.hold(request(10), 1_000_000):
                    pass
            assert refused.value.status == 503 and refused.value.headers == {"Retry-After": "1"}
        async with budget.hold(request(None), 3_000):  # no length declared: the body limit is reserved
            with pytest.raises(PushRefused):
                async with budget.hold(request(1), 1_000_000):
                    pass
        async with budget.hold(request(50_000), 1_000_000):  # alone, one body always fits
            pass

    asyncio.run(scenario())


def test_budget_refusals_over_http_say_why_and_are_counted() -> None:
    from fastapi.testclient import TestClient

    from fleetscope.collectors.steps import StepsCollector
    from fleetscope.config import load
    from fleetscope.serve.daemon import build_daemon

    config = load({"push.max-group-samples": "50", "push.max-samples": "80"}, environ={})
    collector = StepsCollector(config)
    client = TestClient(build_daemon(config, collectors={"steps": collector}).app)
    body = "".join(f'm{{i="{i}"}} 1\n' for i in range(51))
    too_large = client.put("/metrics/job/a", content=body)
    assert too_large.status_code == 413 and "push.max-group-samples" in too_large.json()["detail"]
    assert client.put("/metrics/job/a", content="".join(f'm{{i="{i}"}} 1\n' for i in range(50))).status_code == 200
    over = client.put("/metrics/job/b", content="".join(f'n{{i="{i}"}} 1\n' for i in range(40)))
    assert over.status_code == 429 and "push.max-samples" in over.json()["detail"]
    assert int(over.headers["retry-after"]) > 0
    metrics = client.get("/metrics").text
    assert 'fleetscope_push_rejected_total{reason="too_large"} 1.0' in metrics
    assert 'fleetscope_push_rejected_total{reason="limit"} 1.0' in metrics
    assert "fleetscope_push_group_samples 50.0" in metrics
