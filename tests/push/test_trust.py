"""What a push may say (#35): no names Prometheus or fleetscope give meaning to, no group shadowing
another, label values one bounded line each, and what groups add to /metrics bounded in bytes."""

from __future__ import annotations

import base64

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.push.test_api import make_client

RESERVED = [
    'ALERTS{alertname="TrainingNodeRepeatedlySlow",alertstate="firing"} 1\n',
    'ALERTS_FOR_STATE{alertname="TrainingNodeRepeatedlySlow"} 1.7e9\n',
    "up 0\n",
    "scrape_samples_scraped 1\n",
    'training_job:fleetscope_training_progress:hung{training_job="victim"} 1\n',
    "instance:fleetscope_push_scrape_timestamp_seconds:offset 7\n",
    "fleetscope_training_steps_total 5\n",
    "# TYPE up_ish summary\nup_ish_sum 1\nup_ish_count 1\n# TYPE scrape_x histogram\n"
    'scrape_x_bucket{le="+Inf"} 1\nscrape_x_sum 1\nscrape_x_count 1\n',
]


def exposed_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.parametrize("body", RESERVED)
def test_reserved_names_are_refused_counted_and_never_exposed(body: str) -> None:
    client, collector = make_client()
    response = client.put("/metrics/job/x", content=body)
    assert response.status_code == 400, body
    detail = response.json()["detail"]
    assert "\n" not in detail and ("reserved" in detail or "Prometheus" in detail or "colon" in detail
                                   or "namespace" in detail), detail
    assert collector.store.view().rejected == {"reserved": 1}
    for accept in ("text/plain", "application/openmetrics-text; version=1.0.0"):
        text = client.get("/metrics", headers={"accept": accept}).text
        assert not {"ALERTS", "ALERTS_FOR_STATE", "up", "scrape_samples_scraped"} & exposed_names(text)
        assert ":" not in "".join(exposed_names(text))
    assert 'fleetscope_push_rejected_total{reason="reserved"} 1.0' in client.get("/metrics").text


def test_a_fleetscope_name_is_refused_in_groups_while_the_clients_api_still_takes_steps() -> None:
    client, _ = make_client()
    assert client.put("/metrics/job/x", content="fleetscope_training_loss 1\n").status_code == 400
    report = {"job": "j", "rank": 0, "steps": [{"step": 1, "step_seconds": 0.1}]}
    assert client.post("/api/v1/report", json=report).json() == {"accepted": 1}


@pytest.mark.parametrize("path", [
    "/metrics/job/attacker/training_job/victim",
    "/metrics/job/x/__name__/ALERTS",
    "/metrics/job/x/__address__/y",
])
def test_reserved_grouping_labels_are_refused(path: str) -> None:
    client, collector = make_client()
    response = client.put(path, content="m 0\n")
    assert response.status_code == 400 and "reserved" in response.json()["detail"]
    assert collector.groups.view()[0] == ()


def test_group_shadowing_puts_no_second_series_with_the_victims_labels() -> None:
    client, _ = make_client()
    assert client.put("/metrics/job/victim", content="progress 123456\n").status_code == 200
    assert client.put("/metrics/job/attacker/training_job/victim", content="progress 0\n").status_code == 400
    # The same exposed labels by another spelling: an empty value is an absent label.
    assert client.put("/metrics/job/victim/instance/", content="progress 0\n").status_code == 400
    text = client.get("/metrics").text
    assert [line for line in text.splitlines() if line.startswith("progress")] == [
        'progress{training_job="victim"} 123456.0']
    lasts = [line for line in text.splitlines() if line.startswith("fleetscope_push_group_last_push")]
    assert len(lasts) == 1


def test_a_newline_in_a_job_name_in_the_path_finds_no_route() -> None:
    client, collector = make_client()
    assert client.put("/metrics/job/x%0Agpu 2: Xid 79", content="m 1\n").status_code == 404
    assert collector.groups.view()[0] == ()


@pytest.mark.parametrize("path, body", [
    ("/metrics/job/x%09gpu 2: Xid 79", "m 1\n"),
    ("/metrics/job@base64/" + base64.urlsafe_b64encode(b"x\ngpu 2: Xid 79").decode(), "m 1\n"),
    ("/metrics/job/x/note/a%0Db", "m 1\n"),
    ("/metrics/job/x", 'm{note="a\\nb"} 1\n'),
    ("/metrics/job/x", 'm{note="a\tb"} 1\n'),
    ("/metrics/job/x", 'm{note="a\u2028b"} 1\n'),
])
def test_a_control_character_in_a_job_name_or_label_value_is_refused(path: str, body: str) -> None:
    client, collector = make_client()
    response = client.put(path, content=body)
    assert response.status_code == 400 and "control character" in response.json()["detail"]
    assert collector.groups.view()[0] == ()


def test_long_label_values_are_refused() -> None:
    client, _ = make_client()
    note = base64.urlsafe_b64encode(b"n" * 12_000).decode()
    assert client.put(f"/metrics/job/x/note@base64/{note}", content="m 1\n").status_code == 400
    assert client.put("/metrics/job/x", content=f'm{{note="{"n" * 48_000}"}} 1\n').status_code == 400
    assert client.put("/metrics/job/x", content=f'm{{note="{"n" * 1000}"}} 1\n').status_code == 200


def test_exposition_bytes_are_budgeted_with_grouping_labels_on_every_sample() -> None:
    """5,000 samples under a 1,000-character grouping label: 5 MB of /metrics from a 70 KB body."""
    client, collector = make_client(max_bytes=8 << 20)
    body = "".join(f"m{{i=\"{i}\"}} 1\n" for i in range(5000))
    statuses = [client.put(f"/metrics/job/x{n}/note/{'n' * 1000}", content=body).status_code for n in range(4)]
    assert statuses == [200, 429, 429, 429]
    assert collector.store.view().rejected == {"limit": 3}
    response = client.put("/metrics/job/y/note/n", content=body)
    assert response.status_code == 200
    text = client.get("/metrics").text
    assert len(text.encode()) < 16 << 20
    budgeted = collector.groups.bytes()
    assert budgeted <= 8 << 20
    pushed = sum(len(line) + 1 for line in text.splitlines() if line.startswith(("m{", "fleetscope_push_group_last")))
    assert pushed <= budgeted  # the budget counts at least what the groups add
    assert exposed_value(text, "fleetscope_push_group_bytes") == budgeted


def exposed_value(text: str, name: str) -> float:
    [value] = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    return value


def test_a_control_character_in_a_reported_job_id_is_refused() -> None:
    client, collector = make_client()
    assert client.post("/api/v1/report", json={"job": "x\u2028gpu 2", "rank": 0}).status_code == 422
    response = client.post("/api/v1/report", json={"job": "x\ngpu 2: Xid 79", "rank": 0})
    assert response.status_code == 422 and response.json()["detail"][0]["field"] == "body.job"
    assert client.post("/api/v1/steps", json={"job": "x\x1b[2J", "rank": 0, "step": 1, "step_seconds": 1}
                       ).status_code == 422
    assert collector.store.view().ranks == ()
