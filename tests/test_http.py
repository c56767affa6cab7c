"""The HTTP app against a real uvicorn server, with test-double collectors."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time

import httpx
import pytest
from prometheus_client.core import GaugeMetricFamily

from fleetscope.collectors import CollectorEntry
from fleetscope.config import load
from fleetscope.daemon import build_daemon

from .conftest import free_port


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
def server():
    config = load({"collector.stuck.timeout": "0.3", "collector.stuck.interval": "60",
                   "collector.steady.interval": "60"}, environ={}, registry=REGISTRY)
    stuck = NeverReturns()
    daemon = build_daemon(config, registry=REGISTRY, collectors={"steady": Steady(), "stuck": stuck})
    port = free_port()
    daemon.config = load({"web.listen-address": f"127.0.0.1:{port}"}, environ={}, registry=REGISTRY)
    thread = threading.Thread(target=asyncio.run, args=(daemon.serve(),), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/healthz", timeout=0.5)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    yield base, daemon
    stuck.release.set()
    daemon.request_stop()
    thread.join(5)


def test_hung_collector_leaves_metrics_answering_fast(server):
    base, daemon = server
    assert daemon.engine.wait_ready(5)
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        response = httpx.get(base + "/metrics", timeout=5)
        timings.append(time.perf_counter() - started)
        assert response.status_code == 200
    assert 'fleetscope_collector_success{collector="stuck"} 0.0' in response.text
    assert 'fleetscope_collector_success{collector="steady"} 1.0' in response.text
    assert 'fleetscope_test_value{k="label-7"} 7.0' in response.text
    # The bound: a scrape answers within 100 ms although one source never returns.
    assert min(timings) < 0.1


def test_probes_and_landing_page(server):
    base, daemon = server
    assert httpx.get(base + "/healthz").text == "ok\n"
    assert daemon.engine.wait_ready(5)
    assert httpx.get(base + "/readyz").status_code == 200
    landing = httpx.get(base + "/")
    assert "fleetscope" in landing.text and 'href="/metrics"' in landing.text


def test_openmetrics_by_negotiation_and_gzip(server):
    base, daemon = server
    daemon.engine.wait_ready(5)
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
