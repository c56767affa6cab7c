"""Cross-node findings: what ``check`` makes of every kind of answer (and non-answer) from Prometheus.

A real Prometheus answers the healthy path in tests/e2e/test_node_verdicts.py; the answers a real one
gives only when broken (errors, garbage, silence) come from a small stand-in here.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetscope.check.prometheus import cross_node_findings, own_instance
from fleetscope.collectors.protocol import Finding
from fleetscope.config import load

Answer = Callable[[str], tuple[int, Any]]  # query -> (HTTP status, JSON body or raw bytes)


def vector(*samples: tuple[dict[str, str], float]) -> tuple[int, Any]:
    return 200, {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [time.time(), str(value)]} for labels, value in samples]}}


@pytest.fixture
def prometheus() -> Iterator[Callable[[Answer], str]]:
    servers: list[ThreadingHTTPServer] = []
    asked: list[str] = []

    def start(answer: Answer) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                expr = urllib.parse.parse_qs(body)["query"][0]
                asked.append(expr)
                status, payload = answer(expr)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up waiting (the timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    start.asked = asked  # type: ignore[attr-defined]
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def findings(url: str, instance: str = "n1", timeout: float = 240.0, **settings: str) -> list[tuple[str, str]]:
    """The check's cross-node findings; ``timeout`` (check.prometheus-timeout) is a hang guard unless a test
    is about it: an answering server ends the exchange at once, a loaded machine only makes it later."""
    config = load({"check.prometheus-url": url, "check.instance": instance,
                   "check.prometheus-timeout": str(timeout), **settings}, environ={})
    return [(f.severity, f.message) for f in cross_node_findings(config.check, time.monotonic() + timeout)]


def cluster_of_ten(alerts: list[tuple[dict[str, str], float]], carrying: int = 1) -> Answer:
    def answer(expr: str) -> tuple[int, Any]:
        if expr.startswith("up{"):
            up = {"__name__": "up", "instance": "n1", "job": "fleetscope", "cluster": "c"}
            return vector((up, 0), *(({"cluster": "c", **labels}, value) for labels, value in alerts))
        if "max_over_time(up" in expr:
            return vector(({}, 10))
        if expr.startswith("count (") and "ALERTS" in expr:
            return vector(({}, carrying))
        return vector()
    return answer


def test_straggler_ranks_with_a_node_cause_name_rank_cause_and_job(prometheus) -> None:
    alerts = [({"alertname": "TrainingStragglerRank", "instance": "n1", "training_job": "llama", "rank": r,
                "cause": "gpu_throttled"}, 1) for r in ("12", "9", "9")]
    assert findings(prometheus(cluster_of_ten(alerts))) == [
        ("unhealthy", "straggler: rank 9 +1, GPU throttled, job llama")]


def test_late_nccl_rank(prometheus) -> None:
    alerts = [({"alertname": "NcclLateRank", "instance": "n1", "training_job": "gpt", "rank": "3"}, 1)]
    assert findings(prometheus(cluster_of_ten(alerts))) == [("unhealthy", "late NCCL rank: rank 3, job gpt")]


def test_breaker_counts_within_the_cluster_of_the_node(prometheus) -> None:
    alerts = [({"alertname": "NcclLateRank", "instance": "n1", "training_job": "gpt", "rank": "3"}, 1)]
    url = prometheus(cluster_of_ten(alerts, carrying=3))
    assert findings(url) == [("unknown", "breaker: late NCCL rank on 3 of 10 nodes (>2)")]
    assert findings(url, **{"check.breaker-percent": "30"}) == [("unhealthy", "late NCCL rank: rank 3, job gpt")]
    counted = [q for q in prometheus.asked if q.startswith("count (")]
    assert counted and all('cluster="c"' in q for q in counted)


def test_an_alert_that_is_no_node_finding_or_of_another_cluster_is_ignored(prometheus) -> None:
    assert findings(prometheus(cluster_of_ten([({"alertname": "TrainingInputBound"}, 1)]))) == []
    other = {"alertname": "TrainingNodeRepeatedlySlow", "instance": "n1"}
    answer = cluster_of_ten([])
    url = prometheus(lambda q: answer(q) if not q.startswith("up{") else vector(
        ({"__name__": "up", "instance": "n1", "cluster": "c"}, 1), ({**other, "cluster": "elsewhere"}, 1)))
    assert findings(url) == []


def test_nothing_found_is_one_question(prometheus) -> None:
    assert findings(prometheus(cluster_of_ten([]))) == []
    (asked,) = prometheus.asked
    assert asked.startswith('up{job="fleetscope", instance="n1"}\nor\n(\n  ALERTS{alertname=')


@pytest.mark.parametrize("answer, message", [
    (lambda q: (503, {"status": "error", "error": "query timed out"}), "Prometheus HTTP 503 query timed out"),
    (lambda q: (200, b"<html>login</html>"), "Prometheus not a Prometheus query answer"),
    (lambda q: (200, {"status": "error", "error": "bad_data: parse error"}),
     "Prometheus error answer: bad_data: parse error"),
    (lambda q: (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}),
     "Prometheus expected a vector, got matrix"),
    (lambda q: vector(), "Prometheus has no target instance=n1 (check.instance?)"),
    (lambda q: vector(({"__name__": "up", "instance": "n1", "cluster": "a"}, 1),
                      ({"__name__": "up", "instance": "n1", "cluster": "b"}, 1)),
     "instance n1 is in 2 clusters: add cluster=... to check.selector"),
])
def test_anything_but_an_answer_is_could_not_tell(prometheus, answer: Answer, message: str) -> None:
    assert findings(prometheus(answer)) == [("unknown", message)]


def test_no_nodes_to_weigh_against_is_could_not_tell(prometheus) -> None:
    def answer(expr: str) -> tuple[int, Any]:
        if expr.startswith("up{"):
            return vector(({"__name__": "up", "instance": "n1"}, 1),
                          ({"alertname": "TrainingNodeRepeatedlySlow", "instance": "n1"}, 1))
        return vector()
    assert findings(prometheus(answer)) == [
        ("unknown", "Prometheus counts no fleetscope nodes to weigh findings against")]


def test_a_prometheus_that_never_answers_is_given_up_on_in_time(prometheus) -> None:
    release = threading.Event()
    url = prometheus(lambda q: (release.wait(30), vector())[1])
    try:  # it answers only once released: the check gives up at its deadline, not waiting
        assert findings(url, timeout=0.5) == [("unknown", "Prometheus no answer within 0.5s")]
    finally:
        release.set()


def test_the_instance_defaults_to_the_short_host_name(monkeypatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "ip-10-0-1-23.ec2.internal")
    assert own_instance(load({}, environ={}).check) == "ip-10-0-1-23"
    assert own_instance(load({"check.instance": "gpu-st-1"}, environ={}).check) == "gpu-st-1"


def test_no_url_is_could_not_tell() -> None:
    config = load({}, environ={})
    assert cross_node_findings(config.check, time.monotonic() + 1) == [
        Finding("training", "unknown", "", "check.prometheus-url is not set")]


def test_a_repair_in_place_suspends_a_finding_of_history_until_the_node_is_flagged_again(prometheus, tmp_path) -> None:
    repeat = [({"alertname": "TrainingNodeRepeatedlySlow", "instance": "n1"}, 1)]
    flagged_since = {"now": 0}
    answer = cluster_of_ten(repeat)

    def with_flags(expr: str) -> tuple[int, Any]:
        if "last_over_time(instance_training_job:fleetscope_training_straggler:count" in expr:
            return vector(({}, flagged_since["now"])) if flagged_since["now"] else vector()
        return answer(expr)

    url = prometheus(with_flags)
    repaired = tmp_path / "repaired"
    settings = {"check.repaired-file": str(repaired)}
    assert findings(url, **settings) == [("unhealthy", "repeat straggler")]
    repaired.touch()
    os.utime(repaired, (time.time() - 3600, time.time() - 3600))
    (severity, message), = findings(url, **settings)
    assert severity == "warning"
    assert re.match(r"repeat straggler not counted: repaired 36\d\ds ago, not flagged since", message)
    asked = [q for q in prometheus.asked if "last_over_time(instance_training_job" in q]
    assert asked and all('instance="n1", cluster="c"}[36' in q for q in asked)
    flagged_since["now"] = 1
    assert findings(url, **settings) == [("unhealthy", "repeat straggler")]
