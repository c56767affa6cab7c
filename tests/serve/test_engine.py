from __future__ import annotations

import gzip
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from fleetscope.errors import NoHardware
from fleetscope.serve.engine import MAX_FORMATS, CollectorRunner, Engine, LiveCollector
from fleetscope.serve.exposition import Renderer, negotiate
from fleetscope_sim.harness import eventually

PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


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


HANG = 240.0  # seconds: guards a hang only (inside pytest-timeout's 300); each wait returns once it holds


def registry_for(*runners) -> tuple[Engine, CollectorRegistry]:
    engine = Engine(runners)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(engine)
    return engine, registry


def test_successful_collection_is_served_with_self_metrics():
    runner = CollectorRunner("counting", Counting(), interval=60, timeout=HANG, staleness=60)
    engine, registry = registry_for(runner)
    runner.run_once()
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 1
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "counting"}) == 1
    assert registry.get_sample_value("fleetscope_collector_hardware_present", {"collector": "counting"}) == 1
    last_success = "fleetscope_collector_last_success_timestamp_seconds"
    assert registry.get_sample_value(last_success, {"collector": "counting"}) > 0
    assert engine.ready()


def test_hung_source_never_delays_the_scrape_and_reports_failure():
    hanging = Hanging()
    runner = CollectorRunner("hanging", hanging, interval=60, timeout=0.2, staleness=60)
    healthy = CollectorRunner("counting", Counting(), interval=60, timeout=HANG, staleness=60)
    _, registry = registry_for(runner, healthy)
    healthy.run_once()
    reading = runner.run_once()
    assert reading.status == "timeout"
    # The source still hangs (it is released only below): a scrape that waited on it would never return.
    scrape = ThreadPoolExecutor(1).submit(lambda: (
        registry.get_sample_value("fleetscope_collector_success", {"collector": "hanging"}),
        registry.get_sample_value("fleetscope_test_value", {"k": "a"})))
    assert scrape.result(timeout=60) == (0, 1)
    assert not hanging.release.is_set()
    # A second attempt is not stacked on the stuck one.
    again = runner.run_once()
    assert again.status == "timeout" and "still running" in again.error
    # When the source comes back, its late result is served.
    hanging.release.set()
    assert _wait_until(lambda: registry.get_sample_value("fleetscope_test_late") == 1)
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "hanging"}) == 1


def test_stale_series_disappear():
    now = [1000.0]
    runner = CollectorRunner("counting", Counting(), interval=1, timeout=HANG, staleness=30, clock=lambda: now[0])
    _, registry = registry_for(runner)
    done = runner.run_once()
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 1
    now[0] += 31
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) is None
    # The self-metrics stay, so the staleness is visible to rules. The success is the collection's end: its start
    # on the runner's clock plus the time it took, real time (2 ms in a fresh-clone run at load 4, not 0).
    last_success = "fleetscope_collector_last_success_timestamp_seconds"
    assert registry.get_sample_value(last_success, {"collector": "counting"}) == 1000.0 + done.duration


def test_no_hardware_is_not_failure():
    runner = CollectorRunner("absent", Absent(), interval=60, timeout=HANG, staleness=60)
    _, registry = registry_for(runner)
    assert runner.run_once().status == "no_hardware"
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "absent"}) == 1
    assert registry.get_sample_value("fleetscope_collector_hardware_present", {"collector": "absent"}) == 0


def test_without_a_timeout_an_attempt_runs_in_the_calling_thread_and_still_records_every_outcome():
    """timeout=None (the virtual-time run's runners): no worker thread, the same records as with one."""

    class Where:
        tables = ()

        def __init__(self) -> None:
            self.threads: list[threading.Thread] = []

        def collect(self):
            self.threads.append(threading.current_thread())
            return Counting().collect()

    where = Where()
    runner = CollectorRunner("where", where, interval=60, timeout=None, staleness=60)
    broken = CollectorRunner("broken", Broken(), interval=60, timeout=None, staleness=60)
    absent = CollectorRunner("absent", Absent(), interval=60, timeout=None, staleness=60)
    _, registry = registry_for(runner, broken, absent)
    assert [runner.run_once().status, broken.run_once().status, absent.run_once().status] == \
        ["ok", "failed", "no_hardware"]
    assert where.threads == [threading.current_thread()]
    runner.wait_fresh()  # no worker will bring a collection: returns at once, never waits on a deadline of None
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 1
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "broken"}) == 0
    assert registry.get_sample_value("fleetscope_collector_hardware_present", {"collector": "absent"}) == 0


def test_failure_keeps_other_collectors_and_drops_own_series_after_staleness():
    broken = CollectorRunner("broken", Broken(), interval=60, timeout=HANG, staleness=60)
    good = CollectorRunner("counting", Counting(), interval=60, timeout=HANG, staleness=60)
    _, registry = registry_for(broken, good)
    broken.run_once()
    good.run_once()
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "broken"}) == 0
    assert registry.get_sample_value("fleetscope_collector_success", {"collector": "counting"}) == 1
    last_success = "fleetscope_collector_last_success_timestamp_seconds"
    assert registry.get_sample_value(last_success, {"collector": "broken"}) is None


def test_background_loop_collects_repeatedly_and_stops():
    counting = Counting()
    runner = CollectorRunner("counting", counting, interval=0.05, timeout=HANG, staleness=60)
    engine, _ = registry_for(runner)
    engine.start()
    try:
        assert engine.wait_ready(HANG)
        assert _wait_until(lambda: counting.calls >= 3)
    finally:
        engine.stop()


def test_live_collector_reads_at_scrape_time():
    counting = Counting()
    _, registry = registry_for(LiveCollector("live", counting))
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 1
    assert registry.get_sample_value("fleetscope_test_value", {"k": "a"}) == 2


def test_exposition_concatenates_collectors_into_one_valid_exposition():
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    a = CollectorRunner("a", Counting(), interval=60, timeout=HANG, staleness=60)
    b = CollectorRunner("b", Absent(), interval=60, timeout=HANG, staleness=60)
    live = LiveCollector("live", type("Other", (), {"collect": lambda self: [_other_family()]})())
    engine = Engine([a, b, live])
    a.run_once()
    b.run_once()
    for accept, parse in (("", parse_text), (PROMETHEUS_2, parse_openmetrics)):
        fmt = negotiate(accept)
        text = engine.exposition(fmt, compressed=False).decode()
        families = {f.name: f for f in parse(text)}
        assert text.count("# EOF") == (1 if fmt.openmetrics else 0)
        assert {s.labels["collector"] for s in families["fleetscope_collector_success"].samples} == {"a", "b", "live"}
        assert families["fleetscope_test_value"].samples[0].value == 1
        assert families["fleetscope_test_other"].samples[0].value == 7


def test_the_serving_process_reports_itself_at_every_scrape():
    """process_* from prometheus_client's ProcessCollector, in both formats and on the registry path; read anew
    at each scrape (CPU seconds and memory move while the collectors' chunks are reused)."""
    from prometheus_client import ProcessCollector
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    a = CollectorRunner("a", Counting(), interval=60, timeout=HANG, staleness=60)
    engine = Engine([a], process=ProcessCollector(registry=None))
    a.run_once()
    for accept, parse in (("", parse_text), (PROMETHEUS_2, parse_openmetrics)):
        fmt = negotiate(accept)

        def scrape(parse=parse, fmt=fmt) -> dict[str, float]:
            text = engine.exposition(fmt, compressed=False).decode()
            return {s.name: s.value for f in parse(text) for s in f.samples}

        first = scrape()
        assert first["process_resident_memory_bytes"] > 1_000_000
        assert first["process_open_fds"] > 0
        assert first["process_start_time_seconds"] > 1_600_000_000
        started = time.process_time()
        while time.process_time() - started < 0.05:  # some CPU time, so the next reading is later
            pass
        assert scrape()["process_cpu_seconds_total"] > first["process_cpu_seconds_total"]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(engine)
    assert registry.get_sample_value("process_max_fds") > 0
    # Without one (tests, tools), no process_* at all: its values would be the test runner's.
    plain = Engine([a]).exposition(negotiate(""), compressed=False).decode()
    assert "process_" not in plain


def _other_family():
    family = GaugeMetricFamily("fleetscope_test_other", "another collector's family")
    family.add_metric([], 7)
    return family


class CountingRenders:
    """Counts, per family name, what Renderer.render is asked to render (the encoder or a template)."""

    def __init__(self, monkeypatch) -> None:
        self.rendered: list[str] = []
        real = Renderer.render

        def render(renderer, metrics, fmt):
            self.rendered.extend(f.name for f in metrics)
            return real(renderer, metrics, fmt)

        monkeypatch.setattr(Renderer, "render", render)

    def count(self, name: str) -> int:
        return self.rendered.count(name)


@pytest.mark.parametrize("compressed", [False, True])
def test_a_reading_is_served_as_the_same_bytes_until_the_next_one(compressed, monkeypatch):
    renders = CountingRenders(monkeypatch)
    fmt = negotiate(PROMETHEUS_2)
    runner = CollectorRunner("counting", Counting(), interval=60, timeout=HANG, staleness=60)
    engine = Engine([runner])
    runner.run_once()
    first = engine.exposition(fmt, compressed)
    second = engine.exposition(fmt, compressed)
    assert first == second
    text = gzip.decompress(first) if compressed else first
    assert b'fleetscope_test_value{k="a"} 1.0' in text
    assert renders.count("fleetscope_test_value") == 1  # rendered once for two scrapes
    assert renders.count("fleetscope_collector_success") == 1  # self-metrics unchanged: not rendered again
    runner.run_once()
    third = engine.exposition(fmt, compressed)
    text = gzip.decompress(third) if compressed else third
    assert b'fleetscope_test_value{k="a"} 2.0' in text
    assert renders.count("fleetscope_test_value") == 2


def test_a_new_reading_is_rendered_before_it_is_served_in_the_formats_asked_for(monkeypatch):
    renders = CountingRenders(monkeypatch)
    openmetrics = negotiate(PROMETHEUS_2)
    runner = CollectorRunner("counting", Counting(), interval=60, timeout=HANG, staleness=60)
    engine = Engine([runner])
    runner.run_once()
    engine.exposition(openmetrics, compressed=True)
    assert renders.count("fleetscope_test_value") == 1
    runner.run_once()  # the collector's thread renders the new reading, as the scraper asked for it before
    assert renders.count("fleetscope_test_value") == 2
    body = gzip.decompress(engine.exposition(openmetrics, compressed=True))
    assert b'fleetscope_test_value{k="a"} 2.0' in body
    assert renders.count("fleetscope_test_value") == 2  # the scrape rendered nothing of it
    # A format nobody asked for is not rendered ahead; asked for, it is rendered then.
    text = engine.exposition(negotiate("text/plain;version=0.0.4"), compressed=False)
    assert b'fleetscope_test_value{k="a"} 2.0' in text and renders.count("fleetscope_test_value") == 3


def test_stale_reading_is_not_served_from_the_cache():
    now = [1000.0]
    runner = CollectorRunner("counting", Counting(), interval=1, timeout=HANG, staleness=30, clock=lambda: now[0])
    engine = Engine([runner])
    fmt = negotiate("text/plain")
    runner.run_once()
    assert b"fleetscope_test_value" in engine.exposition(fmt, compressed=False)
    now[0] += 31
    body = engine.exposition(fmt, compressed=False)
    assert b"fleetscope_test_value" not in body
    assert b'fleetscope_collector_success{collector="counting"} 1.0' in body


class Unrenderable:
    """Families an encoder refuses (a sample whose value is not a number)."""

    tables = ()

    def collect(self):
        family = GaugeMetricFamily("fleetscope_test_broken", "broken")
        family.add_metric([], "not a number")  # type: ignore[arg-type]
        return [family]


def test_series_that_cannot_be_rendered_leave_the_rest_of_the_scrape():
    broken = CollectorRunner("broken", Unrenderable(), interval=60, timeout=HANG, staleness=60)
    good = CollectorRunner("counting", Counting(), interval=60, timeout=HANG, staleness=60)
    engine = Engine([broken, good])
    broken.run_once()
    good.run_once()
    body = engine.exposition(negotiate(PROMETHEUS_2), compressed=False)
    assert b"fleetscope_test_value" in body and b"fleetscope_test_broken" not in body
    assert body.endswith(b"# EOF\n")


class Versioned(Counting):
    """Live state with a generation: its series change only when the generation does."""

    def __init__(self) -> None:
        super().__init__()
        self.version = 0

    def generation(self):
        return self.version


def test_live_collector_with_a_generation_is_collected_again_only_when_it_changed(monkeypatch):
    renders = CountingRenders(monkeypatch)
    versioned = Versioned()
    fmt = negotiate(PROMETHEUS_2)
    engine = Engine([LiveCollector("live", versioned)])
    first = engine.exposition(fmt, compressed=False)
    engine.exposition(fmt, compressed=False)
    assert versioned.calls == 1 and renders.count("fleetscope_test_value") == 1
    versioned.version += 1
    assert b'fleetscope_test_value{k="a"} 2.0' in engine.exposition(fmt, compressed=False)
    assert versioned.calls == 2
    assert b'fleetscope_test_value{k="a"} 1.0' in first


def test_live_collector_without_a_generation_is_read_on_every_scrape():
    counting = Counting()
    engine = Engine([LiveCollector("live", counting)])
    fmt = negotiate("text/plain")
    engine.exposition(fmt, compressed=False)
    assert b'fleetscope_test_value{k="a"} 2.0' in engine.exposition(fmt, compressed=False)


def _wait_until(condition, timeout=HANG):
    return eventually(condition, timeout, interval=0.01)


def test_unscraped_collector_pauses_and_the_next_scrape_wakes_it_with_a_fresh_reading():
    now = [1000.0]
    counting = Counting()
    runner = CollectorRunner("counting", counting, interval=0.02, timeout=HANG, staleness=5, idle_after=0.2,
                             clock=lambda: now[0])
    engine = Engine([runner])
    engine.start()
    try:
        assert _wait_until(lambda: runner.paused)
        calls = counting.calls
        time.sleep(0.2)  # not a wait for timing: paused, it collects nothing however long one looks
        assert counting.calls == calls  # paused: no collection nobody would read
        now[0] += 10  # the last reading is stale by now
        # From the scrape on, a loaded machine may take its time: the collector counts as scraped until the test
        # is done looking (with 0.2 s it could pause again before its next collections ran).
        runner.idle_after = HANG
        body = engine.exposition(negotiate("text/plain"), compressed=False)
        assert f'fleetscope_test_value{{k="a"}} {calls + 1}.0'.encode() in body  # waited for the new reading
        assert _wait_until(lambda: counting.calls >= calls + 3)  # and it keeps collecting while scraped
        assert not runner.paused
    finally:
        engine.stop()


def test_a_scrape_that_would_render_or_wait_is_left_to_a_thread_when_it_must_not_block():
    now = [1000.0]
    counting = Counting()
    runner = CollectorRunner("counting", counting, interval=0.02, timeout=HANG, staleness=5, idle_after=0.2,
                             clock=lambda: now[0])
    engine = Engine([runner])
    fmt = negotiate(PROMETHEUS_2)
    runner.run_once()
    assert engine.exposition(fmt, compressed=True, block=False) is None  # this format was never rendered
    assert engine.exposition(fmt, compressed=True) is not None
    assert b'fleetscope_test_value{k="a"} 1.0' in gzip.decompress(engine.exposition(fmt, True, block=False))
    engine.start()
    try:
        assert _wait_until(lambda: runner.paused)
        now[0] += 10
        calls = counting.calls
        # What the HTTP route does: the event loop finds it would have to wait, a thread waits.
        assert engine.exposition(fmt, compressed=False, block=False) is None
        body = engine.exposition(fmt, compressed=False)
        assert f'fleetscope_test_value{{k="a"}} {calls + 1}.0'.encode() in body
    finally:
        engine.stop()


def test_collector_that_must_not_pause_keeps_collecting_unscraped():
    counting = Counting()
    runner = CollectorRunner("counting", counting, interval=0.02, timeout=HANG, staleness=5, idle_after=0.05,
                             pausable=False)
    engine = Engine([runner])
    engine.start()
    try:
        assert _wait_until(lambda: counting.calls >= 20)
        assert not runner.paused
    finally:
        engine.stop()


def test_stop_ends_a_paused_collector():
    runner = CollectorRunner("counting", Counting(), interval=0.01, timeout=HANG, staleness=1, idle_after=0.05)
    runner.start()
    assert _wait_until(lambda: runner.paused)
    runner.stop()
    assert runner._thread is not None
    runner._thread.join(HANG)
    assert not runner._thread.is_alive()


def test_formats_rendered_ahead_stay_few_whatever_scrapers_ask_for(monkeypatch):
    renders = CountingRenders(monkeypatch)
    runner = CollectorRunner("counting", Counting(), interval=60, timeout=HANG, staleness=60)
    engine = Engine([runner])
    runner.run_once()
    for minor in range(50):  # a client can name any OpenMetrics version
        engine.exposition(negotiate(f"application/openmetrics-text;version=1.0.{minor}"), compressed=False)
    before = renders.count("fleetscope_test_value")
    runner.run_once()
    assert renders.count("fleetscope_test_value") - before == MAX_FORMATS
