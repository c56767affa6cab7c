"""The HTTP app against a real uvicorn server, with test-double collectors."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import threading

import httpx
import pytest
from prometheus_client.core import GaugeMetricFamily

from fleetscope.collectors import CollectorEntry
from fleetscope.config import load
from fleetscope.serve.daemon import build_daemon
from fleetscope_sim.harness import eventually


class Steady:
    tables = ()

    def collect(self):
        family = GaugeMetricFamily("fleetscope_test_value", "A test value.", labels=["k"])
        for i in range(300):
            family.add_metric([f"label-{i}"], i)
        return [family]


class NeverReturns:
    tables = ()

    def __init__(self) -> None:
        self.release = threading.Event()

    def collect(self):
        self.release.wait()
        return []


REGISTRY = {
    "steady": CollectorEntry("tests.test_http:Steady", "test"),
    "stuck": CollectorEntry("tests.test_http:NeverReturns", "test"),
}


@pytest.fixture
def server(tmp_path):
    config = load({"collector.stuck.timeout": "0.3", "collector.stuck.interval": "60",
                   "collector.steady.interval": "60"}, environ={}, registry=REGISTRY)
    stuck = NeverReturns()
    daemon = build_daemon(config, registry=REGISTRY, collectors={"steady": Steady(), "stuck": stuck})
    ready = tmp_path / "ready.json"
    daemon.config = load({"web.listen-address": "127.0.0.1:0", "web.ready-file": str(ready)}, environ={},
                         registry=REGISTRY)
    thread = threading.Thread(target=asyncio.run, args=(daemon.serve(),), daemon=True)
    thread.start()
    bound = eventually(lambda: ready.exists() and json.loads(ready.read_text()), 60, "the daemon to listen")
    yield f"http://{bound['main']}", daemon
    stuck.release.set()
    daemon.request_stop()
    thread.join(5)


def test_hung_collector_leaves_metrics_answering_fast(server):
    base, daemon = server
    assert daemon.engine.wait_ready(240)  # a hang guard
    # The source never returns until the fixture ends: a scrape that waited on it would never answer (the
    # client's deadline only guards that hang). That every scrape answers is the claim; how fast a scrape
    # answers is a benchmark's figure (benchmarks/scrape.py), not a verdict on this machine's load.
    with httpx.Client(timeout=240) as client:
        for _ in range(5):
            response = client.get(base + "/metrics")
            assert response.status_code == 200
    assert 'fleetscope_collector_success{collector="stuck"} 0.0' in response.text
    assert 'fleetscope_collector_success{collector="steady"} 1.0' in response.text
    assert 'fleetscope_test_value{k="label-7"} 7.0' in response.text


def test_probes_and_landing_page(server):
    base, daemon = server
    assert httpx.get(base + "/healthz").text == "ok\n"
    assert daemon.engine.wait_ready(240)  # a hang guard
    assert httpx.get(base + "/readyz").status_code == 200
    landing = httpx.get(base + "/")
    assert "fleetscope" in landing.text and 'href="/metrics"' in landing.text


def test_openmetrics_by_negotiation_and_gzip(server):
    base, daemon = server
    daemon.engine.wait_ready(240)  # a hang guard
    om = httpx.get(base + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
    raw = httpx.get(base + "/metrics", headers={"Accept-Encoding": "gzip"})
    assert raw.headers.get("content-encoding") == "gzip"
    assert "fleetscope_test_value" in raw.text  # httpx decodes; the header proves it was compressed
    plain = httpx.get(base + "/metrics", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert gzip.compress(plain.content)  # the plain body is the uncompressed text
    assert plain.headers["content-type"].startswith("text/plain")


PROMETHEUS_2_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def _raw_get(base: str, headers: dict[str, str]) -> tuple[http.client.HTTPResponse, bytes]:
    """GET without any client-side decoding: the bytes as served."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


def test_scrape_like_prometheus_gets_the_same_gzip_bytes_for_the_same_reading(server):
    base, daemon = server
    assert daemon.engine.wait_ready(240)  # a hang guard
    scrape = {"Accept": PROMETHEUS_2_ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "Prometheus/2.42.0"}
    first, packed = _raw_get(base, scrape)
    assert first.status == 200
    assert first.getheader("Content-Encoding") == "gzip"
    assert first.getheader("Content-Type").startswith("application/openmetrics-text; version=1.0.0")
    assert "Accept-Encoding" in first.getheader("Vary")
    _, again = _raw_get(base, scrape)
    assert again == packed
    plain_response, plain = _raw_get(base, {"Accept": PROMETHEUS_2_ACCEPT, "Accept-Encoding": "identity"})
    assert plain_response.getheader("Content-Encoding") is None
    assert gzip.decompress(packed) == plain
    assert plain.endswith(b"# EOF\n") and b'fleetscope_test_value{k="label-7"} 7.0' in plain


def test_scrape_refusing_gzip_or_asking_for_text_gets_it(server):
    base, daemon = server
    assert daemon.engine.wait_ready(240)  # a hang guard
    response, body = _raw_get(base, {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "gzip;q=0"})
    assert response.getheader("Content-Encoding") is None
    assert response.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# EOF" not in body and b'fleetscope_test_value{k="label-7"} 7.0' in body
