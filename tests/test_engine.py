from __future__ import annotations

import threading
import time

import pytest

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from fleetscope.engine import CollectorRunner, Engine, LiveCollector
from fleetscope.errors import NoHardware


class Counting:
    """A collector whose value changes on every collection."""

    tables = ()

    def __init__(self) -> None:
        self.calls = 0

    def collect(self):
        self.calls += 1
        family = GaugeMetricFamily("fleetscope_test_value", "test", labels=["k"])
        family.add_metric(["a"], self.calls)
        return [family]


class Hanging:
    tables = ()

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def collect(self):
        self.entered.set()
        self.release.wait()
        family = GaugeMetricFamily("fleetscope_test_late", "late")
        family.add_metric([], 1)
        return [family]


class Absent:
    tables = ()

    def collect(self):
        raise NoHardware("no such device")


class Broken:
    tables = ()

    def collect(self):
        raise OSError("boom")


def registry_for(*runners) -> tuple[Engine, CollectorRegistry]:
    engine = Engine(runners)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(engine)
    return engine, registry


def test_successful_collection_is_served_with_self_metrics():
    runner = CollectorRunner("counting", Counting(), interval=60, timeout=1, staleness=60)
    engine, registry = registry_for(runner)
    runner.run_once()
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 1
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "counting"}) == 1
    assert registry.get_sample_value("fleetscope_collector_hardware_present", {"collector": "counting"}) == 1
    assert registry.get_sample_value("fleetscope_collector_last_success_timestamp_seconds", {"collector": "counting"}) > 0
    assert engine.ready()


def test_hung_source_never_delays_the_scrape_and_reports_failure():
    hanging = Hanging()
    runner = CollectorRunner("hanging", hanging, interval=60, timeout=0.2, staleness=60)
    healthy = CollectorRunner("counting", Counting(), interval=60, timeout=1, staleness=60)
    engine, registry = registry_for(runner, healthy)
    healthy.run_once()
    reading = runner.run_once()
    assert reading.status == "timeout"
    started = time.perf_counter()
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "hanging"}) == 0
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 1
    assert time.perf_counter() - started < 0.1
    # A second attempt is not stacked on the stuck one.
    again = runner.run_once()
    assert again.status == "timeout" and "still running" in again.error
    # When the source comes back, its late result is served.
    hanging.release.set()
    for _ in range(50):
        if registry.get_sample_value("fleetscope_test_late") == 1:
            break
        time.sleep(0.02)
    assert registry.get_sample_value("fleetscope_test_late") == 1
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "hanging"}) == 1


def test_stale_series_disappear():
    now = [1000.0]
    runner = CollectorRunner("counting", Counting(), interval=1, timeout=1, staleness=30, clock=lambda: now[0])
    _, registry = registry_for(runner)
    runner.run_once()
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 1
    now[0] += 31
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) is None
    # The self-metrics stay, so the staleness is visible to rules.
    assert registry.get_sample_value("fleetscope_collector_last_success_timestamp_seconds", {"collector": "counting"}) == pytest.approx(1000.0)


def test_no_hardware_is_not_failure():
    runner = CollectorRunner("absent", Absent(), interval=60, timeout=1, staleness=60)
    _, registry = registry_for(runner)
    assert runner.run_once().status == "no_hardware"
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "absent"}) == 1
    assert registry.get_sample_value("fleetscope_collector_hardware_present", {"collector": "absent"}) == 0


def test_failure_keeps_other_collectors_and_drops_own_series_after_staleness():
    broken = CollectorRunner("broken", Broken(), interval=60, timeout=1, staleness=60)
    good = CollectorRunner("counting", Counting(), interval=60, timeout=1, staleness=60)
    _, registry = registry_for(broken, good)
    broken.run_once()
    good.run_once()
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "broken"}) == 0
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "counting"}) == 1
    assert registry.get_sample_value("fleetscope_collector_last_success_timestamp_seconds", {"collector": "broken"}) is None


def test_background_loop_collects_repeatedly_and_stops():
    counting = Counting()
    runner = CollectorRunner("counting", counting, interval=0.05, timeout=1, staleness=60)
    engine, registry = registry_for(runner)
    engine.start()
    try:
        assert engine.wait_ready(2)
        deadline = time.monotonic() + 2
        while counting.calls < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert counting.calls >= 3
    finally:
        engine.stop()


def test_live_collector_reads_at_scrape_time():
    counting = Counting()
    _, registry = registry_for(LiveCollector("live", counting))
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 1
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 2


def test_render_concatenates_collectors_into_one_valid_exposition():
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    a = CollectorRunner("a", Counting(), interval=60, timeout=1, staleness=60)
    b = CollectorRunner("b", Absent(), interval=60, timeout=1, staleness=60)
    live = LiveCollector("live", type("Other", (), {"collect": lambda self: [_other_family()]})())
    engine = Engine([a, b, live])
    a.run_once()
    b.run_once()
    for accept, parse in (("", parse_text), ("application/openmetrics-text; version=1.0.0", parse_openmetrics)):
        encoder, content_type = choose_encoder(accept)
        text = engine.render(encoder, content_type).decode()
        families = {f.name: f for f in parse(text)}
        assert text.count("# EOF") == (1 if "openmetrics" in content_type else 0)
        assert {s.labels["collector"] for s in families["fleetscope_collector_success"].samples} == {"a", "b", "live"}
        assert families["fleetscope_test_value"].samples[0].value == 1
        assert families["fleetscope_test_other"].samples[0].value == 7


def _other_family():
    family = GaugeMetricFamily("fleetscope_test_other", "another collector's family")
    family.add_metric([], 7)
    return family


def test_a_reading_is_rendered_once_and_rerendered_after_a_new_one():
    from prometheus_client.exposition import generate_latest

    calls = []

    def encoder(registry):
        calls.append(1)
        return generate_latest(registry)

    runner = CollectorRunner("counting", Counting(), interval=60, timeout=1, staleness=60)
    engine = Engine([runner])
    runner.run_once()
    first = engine.render(encoder, "text/plain")
    second = engine.render(encoder, "text/plain")
    assert first == second and b'fleetscope_test_value{k="a"} 1.0' in first
    assert len(calls) == 3  # self-metrics twice, the reading once
    runner.run_once()
    assert b'fleetscope_test_value{k="a"} 2.0' in engine.render(encoder, "text/plain")
