"""Content negotiation, rendering and the gzip framing of the /metrics body."""

from __future__ import annotations

import gzip
import math
import random
import zlib

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from fleetscope.serve.exposition import EMPTY, Chunk, Format, Renderer, accepts_gzip, assemble, negotiate, render

# What Prometheus sends (scrape/scrape.go): 2.x before scrape_protocols (2.42, Debian's), and 3.x defaults.
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_1 = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        (PROMETHEUS_2, OPENMETRICS_1 + "; escaping=underscores"),
        (PROMETHEUS_3, OPENMETRICS_1 + "; escaping=allow-utf-8"),
        ("application/openmetrics-text", OPENMETRICS_1),
        ("text/plain;version=1.0.0;escaping=allow-utf-8",
         "text/plain; version=1.0.0; charset=utf-8; escaping=allow-utf-8"),
        ("text/plain;version=0.0.4", TEXT_0_0_4),
        ("text/plain", TEXT_0_0_4),
        ("*/*", TEXT_0_0_4),
        ("", TEXT_0_0_4),
        (None, TEXT_0_0_4),
        ("application/json", TEXT_0_0_4),
        # weights decide, not the order written
        ("application/openmetrics-text;version=1.0.0;q=0.2,text/plain;version=0.0.4;q=0.9", TEXT_0_0_4),
        ("text/plain;version=0.0.4;q=0.5, application/openmetrics-text;version=1.0.0",
         OPENMETRICS_1 + "; escaping=underscores"),
        # q=0 refuses a range; an unreadable weight never makes one preferred
        ("application/openmetrics-text;version=1.0.0;q=0,text/plain;version=0.0.4;q=0.1", TEXT_0_0_4),
        ("application/openmetrics-text;version=1.0.0;q=high,text/plain;version=0.0.4;q=0.1", TEXT_0_0_4),
        # OpenMetrics 0.0.1 is not written: the next range the client accepts is served
        ("application/openmetrics-text;version=0.0.1,text/plain;version=0.0.4;q=0.5", TEXT_0_0_4),
    ],
)
def test_negotiation_serves_the_best_format_the_scraper_accepts(accept: str | None, content_type: str) -> None:
    assert negotiate(accept).content_type == content_type


@pytest.mark.parametrize(
    ("accept_encoding", "gzip_ok"),
    [
        ("gzip", True),  # Prometheus
        ("gzip, deflate, br", True),
        ("deflate;q=1, gzip;q=0.5", True),
        ("x-gzip", True),
        ("*", True),
        ("GZIP", True),
        ("gzip;q=0", False),
        ("gzip;q=0, *", False),  # gzip named and refused: the wildcard does not bring it back
        ("*;q=0", False),
        ("identity", False),  # Prometheus with compression off
        ("", False),
        (None, False),
    ],
)
def test_gzip_only_when_the_scraper_accepts_it(accept_encoding: str | None, gzip_ok: bool) -> None:
    assert accepts_gzip(accept_encoding) is gzip_ok


def _families() -> list[Metric]:
    counter = CounterMetricFamily("fleetscope_test_bytes", "Bytes moved.", labels=["device", "port"])
    for i in range(50):
        counter.add_metric([f"rdmap{i}s0", "1"], 10**12 + 7919 * i)
    gauge = GaugeMetricFamily("fleetscope_test_devices", 'Devices "seen", with a \\ in help.')
    gauge.add_metric([], 32)
    return [counter, gauge]


def _other() -> list[Metric]:
    gauge = GaugeMetricFamily("fleetscope_test_other", "Another collector's family.", labels=["k"])
    gauge.add_metric(['quote " and \\ and\nnewline'], 7)
    return [gauge]


@pytest.mark.parametrize("accept", [PROMETHEUS_2, PROMETHEUS_3, "text/plain;version=0.0.4"])
def test_chunks_join_into_one_exposition_with_one_eof(accept: str) -> None:
    fmt = negotiate(accept)
    body = assemble([render(_families(), fmt), EMPTY, render(_other(), fmt)], fmt, compressed=False).decode()
    parse = parse_openmetrics if fmt.openmetrics else parse_text
    families = {f.name: f for f in parse(body)}
    assert set(families) == {"fleetscope_test_bytes", "fleetscope_test_devices", "fleetscope_test_other"}
    assert len(families["fleetscope_test_bytes"].samples) == 50
    assert families["fleetscope_test_other"].samples[0].labels["k"] == 'quote " and \\ and\nnewline'
    assert body.count("# EOF") == (1 if fmt.openmetrics else 0)
    assert not fmt.openmetrics or body.endswith("# EOF\n")


@pytest.mark.parametrize("accept", [PROMETHEUS_2, "text/plain;version=0.0.4"])
def test_gzip_body_is_one_member_holding_the_whole_text(accept: str) -> None:
    fmt = negotiate(accept)
    chunks = [render(_families(), fmt), EMPTY, render(_other(), fmt)]
    plain = assemble(chunks, fmt, compressed=False)
    packed = assemble(chunks, fmt, compressed=True)
    assert gzip.decompress(packed) == plain
    # A decoder that reads one member only (zlib.decompressobj, as httpx uses) gets everything, and no leftovers.
    single = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert single.decompress(packed) == plain
    assert single.eof and single.unused_data == b""
    assert len(packed) < len(plain) / 3


def test_gzip_of_nothing_is_still_valid() -> None:
    fmt = negotiate("text/plain")
    assert gzip.decompress(assemble([], fmt, compressed=True)) == b""
    assert gzip.decompress(assemble([EMPTY], negotiate(PROMETHEUS_2), compressed=True)) == b"# EOF\n"


def test_a_chunk_is_compressed_once() -> None:
    chunk = Chunk(b"fleetscope_test 1.0\n" * 100)
    assert chunk.deflated() is chunk.deflated()


def test_plain_names_give_the_library_encoders_exact_bytes_faster() -> None:
    fmt = negotiate(PROMETHEUS_2)
    assert fmt.plain_names_encode is not None
    families = _families() + _other()
    assert fmt.encoder_for(families) is fmt.plain_names_encode
    assert render(families, fmt).text + b"# EOF\n" == fmt.encode(_Registry(families))


@pytest.mark.parametrize("name", ["fleetscope:job_rate", "fleetscope_test.dotted"])
def test_names_underscore_escaping_changes_use_the_library_encoder(name: str) -> None:
    fmt = negotiate(PROMETHEUS_2)
    gauge = GaugeMetricFamily(name, "A name underscore escaping rewrites.")
    gauge.add_metric([], 1)
    assert fmt.encoder_for([gauge]) is fmt.encode
    assert render([gauge], fmt).text + b"# EOF\n" == fmt.encode(_Registry([gauge]))


def test_formats_without_a_faster_twin() -> None:
    for accept in (PROMETHEUS_3, "text/plain;version=0.0.4", "text/plain;version=1.0.0;escaping=dots"):
        fmt = negotiate(accept)
        assert fmt.plain_names_encode is None
        assert fmt.encoder_for(_families()) is fmt.encode


def test_format_is_named_by_its_content_type() -> None:
    assert negotiate(PROMETHEUS_2) is negotiate(PROMETHEUS_2)  # the same header is parsed once
    assert isinstance(negotiate(PROMETHEUS_2), Format)


def _families_with(values: list[float]) -> list[Metric]:
    counter = CounterMetricFamily("fleetscope_test_bytes", "Bytes moved.", labels=["device", "port"])
    for i, value in enumerate(values):
        counter.add_metric([f"rdmap{i}s0", "1"], value)
    info = InfoMetricFamily("fleetscope_test", 'An info family, "quoted" help.', labels=["device"])
    info.add_metric(["rdmap0s0"], {"fw_version": 'a "b" \\ c\nd'})
    gauge = GaugeMetricFamily("fleetscope_test_ratio", "A ratio.", unit="ratio")
    gauge.add_metric([], values[0] / 7 if values else 0.5)
    return [counter, info, gauge]


ODD_VALUES = [0.0, -0.0, 1.0, 0.1, 1e-9, 123456789.0, 1234567.5, 2.0**53, 1e22, -5.5, math.inf, -math.inf, math.nan]


@pytest.mark.parametrize("accept", [PROMETHEUS_2, PROMETHEUS_3, "text/plain;version=0.0.4",
                                    "text/plain;version=1.0.0;escaping=allow-utf-8"])
def test_a_new_reading_of_the_same_series_is_written_as_the_encoder_writes_it(accept: str) -> None:
    fmt = negotiate(accept)
    renderer = Renderer()
    first = renderer.render(_families_with(list(range(len(ODD_VALUES)))), fmt)
    assert first.text == render(_families_with(list(range(len(ODD_VALUES)))), fmt).text
    rng = random.Random(16)
    for _ in range(20):
        values = [rng.choice(ODD_VALUES) * rng.choice([1, 3, 1e6]) for _ in ODD_VALUES]
        families = _families_with(values)
        assert renderer.render(families, fmt).text == render(families, fmt).text


def test_changed_series_are_rendered_again_by_the_encoder() -> None:
    fmt = negotiate(PROMETHEUS_2)
    renderer = Renderer()
    renderer.render(_families_with([1.0, 2.0]), fmt)
    for families in (
        _families_with([1.0, 2.0, 3.0]),  # a device more
        _families_with([5.0]),  # one fewer
        [_families_with([1.0, 2.0])[0]],  # a family fewer
        _other(),  # other names
    ):
        assert renderer.render(families, fmt).text == render(families, fmt).text
    renamed = _families_with([1.0, 2.0])
    renamed[0].samples[1] = renamed[0].samples[1]._replace(labels={"device": "efa_1", "port": "1"})
    assert b'device="efa_1"' in renderer.render(renamed, fmt).text


def test_samples_with_timestamps_are_always_left_to_the_encoder() -> None:
    fmt = negotiate(PROMETHEUS_2)
    renderer = Renderer()
    gauge = GaugeMetricFamily("fleetscope_test_stamped", "Stamped.")
    gauge.add_metric([], 1.0, timestamp=1700000000.5)
    for value in (1.0, 2.0):
        gauge.samples[0] = gauge.samples[0]._replace(value=value)
        assert renderer.render([gauge], fmt).text == render([gauge], fmt).text


class _Registry:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics
