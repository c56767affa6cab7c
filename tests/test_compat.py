"""fleetscope.compat's contracts: each assumption about a library's internals, checked on the installed release.

A failure here means a new release changed what fleetscope relies on: adapt compat.py (and what uses
it) before moving the library's upper bound in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import h11
import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.samples import Exemplar

from fleetscope import compat

VALUES = [0.0, 1.0, -2.5, 0.1, 1e-9, 123456789.0, 1.2345678901234567, 1e21, 2.0**53 + 2, math.inf, -math.inf, math.nan]


class Families:
    def __init__(self, *metrics: Metric) -> None:
        self.metrics = metrics

    def collect(self) -> tuple[Metric, ...]:
        return self.metrics


def gauge(values: list[float] = VALUES) -> GaugeMetricFamily:
    family = GaugeMetricFamily("plain_gauge", "A gauge.", labels=["i"])
    for index, value in enumerate(values):
        family.add_metric([str(index)], value)
    return family


# -- prometheus_client -------------------------------------------------------------------------------


@pytest.mark.parametrize("encode", [generate_latest, generate_openmetrics], ids=["text", "openmetrics"])
def test_a_plain_sample_is_its_prefix_a_space_and_float_text(encode: Any) -> None:
    text = encode(Families(gauge())).decode()
    lines = [line for line in text.splitlines() if line.startswith("plain_gauge{")]
    assert len(lines) == len(VALUES)
    for index, (line, value) in enumerate(zip(lines, VALUES, strict=True)):
        assert line == f'plain_gauge{{i="{index}"}} {compat.float_text(value)}'


def test_sample_parts_reads_every_sample_and_knows_a_plain_one() -> None:
    family = CounterMetricFamily("with_extras", "A counter.", labels=["a"])
    family.add_metric(["x"], 3.0)
    family.add_metric(["y"], 4.0, timestamp=1700000000.0)
    family.samples.append(family.samples[0]._replace(labels={"a": "z"}, exemplar=Exemplar({"t": "1"}, 1.0)))
    parts = list(compat.sample_parts(family))
    assert [(name, labels, value) for name, labels, value, _ in parts] == [
        ("with_extras_total", {"a": "x"}, 3.0), ("with_extras_total", {"a": "y"}, 4.0),
        ("with_extras_total", {"a": "z"}, 3.0)]
    assert [plain for *_, plain in parts] == [True, False, False]


def test_the_text_encoder_moves_exactly_these_samples_into_families_of_their_own() -> None:
    moved = Metric("moved", "Moved.", "gauge")
    for suffix in ("", *compat.MOVED_SUFFIXES):
        moved.add_sample("moved" + suffix, {}, 1.0)
    text = generate_latest(Families(moved)).decode()
    for suffix in compat.MOVED_SUFFIXES:
        assert f"# TYPE moved{suffix} gauge" in text  # a family of its own, after the rest
    kept = Metric("kept", "Kept.", "gauge")
    kept.add_sample("kept_other", {}, 1.0)
    assert "# TYPE kept_other" not in generate_latest(Families(kept)).decode()


def test_underscores_escaping_is_what_prometheus_negotiates_and_allow_utf8_writes_plain_names_alike() -> None:
    accept = "application/openmetrics-text;version=1.0.0;escaping=underscores"
    encoder, content_type = choose_encoder(accept)
    assert content_type.startswith("application/openmetrics-text")
    assert content_type.endswith(f"escaping={compat.OPENMETRICS_UNDERSCORES}") and "version=1.0.0" in content_type
    families = Families(gauge(), CounterMetricFamily("a_counter", "Counts.", value=7.0))
    assert compat.openmetrics_plain_names_encoder("1.0.0")(families) == encoder(families)


def test_the_text_parser_renames_a_counters_samples_named_like_the_family() -> None:
    (family,) = compat.parse_text_format("# TYPE c counter\nc 1\n")
    assert (family.name, family.type, [s.name for s in family.samples]) == ("c", "counter", ["c_total"])
    (family,) = compat.parse_text_format("# TYPE d_total counter\nd_total 1\n")
    assert (family.name, [s.name for s in family.samples]) == ("d", ["d_total"])


# -- uvicorn -----------------------------------------------------------------------------------------


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 9402)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_uvicorns_h11_protocol_has_what_the_guarded_one_uses() -> None:
    import uvicorn
    from uvicorn.server import ServerState

    protocol_class = compat.H11Protocol
    for hook in ("connection_made", "connection_lost", "data_received", "on_response_complete"):
        assert callable(getattr(protocol_class, hook)), hook
    responses: list[int] = []

    class Counted(protocol_class):  # type: ignore[misc, valid-type]
        def on_response_complete(self) -> None:
            super().on_response_complete()
            responses.append(1)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def exchange() -> None:
        config = uvicorn.Config(app, lifespan="off", log_config=None)
        config.load()
        state = ServerState()
        loop = asyncio.get_running_loop()
        first, second = Counted(config, state, {}, loop), Counted(config, state, {}, loop)
        transport = Transport()
        first.connection_made(transport)
        second.connection_made(Transport())
        assert set(compat.open_connections(first)) == {first, second}  # one set per server, shared
        assert compat.event_loop(first) is loop and compat.transport(first) is transport
        assert compat.client_state(first) is h11.IDLE and compat.between_requests(first)
        first.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        assert compat.client_state(first) is h11.SEND_BODY
        assert not compat.between_requests(first) and not compat.answering(first)
        first.data_received(b"cd")
        for _ in range(50):  # the app runs as a task on the loop
            if responses:
                break
            await asyncio.sleep(0.01)
        assert responses == [1] and compat.answering(first) and compat.between_requests(first)
        assert transport.written.startswith(b"HTTP/1.1 200")
        second.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        compat.abandon_request(second)
        assert second.cycle.disconnected and second.cycle.message_event.is_set()
        first.connection_lost(None)
        second.connection_lost(None)
        assert set(compat.open_connections(first)) == set()
        await asyncio.sleep(0.05)  # let the abandoned request's task see its client gone

    asyncio.run(exchange())
