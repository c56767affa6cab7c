"""Every assumption fleetscope makes about a third-party library's internals, in one place.

Public APIs are used where they are used; what a library does not promise (a private attribute, an
undocumented helper, the exact bytes an encoder writes, a parser's quirk) is reached only through
this module. Each assumption names the version it was written against and has a contract test in
``tests/test_compat.py`` that fails when a release changes it. ``pyproject.toml`` bounds each of
these libraries below its next release; CI moves a bound on purpose, once the contract tests pass
on the new release.

Outside the product: the client's torch internals (FSDP's collectives) stay in
``fleetscope.client.distributed``, because ``client/`` imports nothing of fleetscope but its wire
format, and the NVML fake's slot in ``pynvml`` is the simulator's (``fleetscope_sim.nvml_fake``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.openmetrics import exposition as _openmetrics
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    import asyncio

    from prometheus_client.core import Metric
    from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "MOVED_SUFFIXES",
    "OPENMETRICS_UNDERSCORES",
    "H11Protocol",
    "abandon_request",
    "answering",
    "between_requests",
    "client_state",
    "event_loop",
    "float_text",
    "open_connections",
    "openmetrics_plain_names_encoder",
    "parse_text_format",
    "sample_parts",
    "transport",
]

# -- prometheus_client 0.26 ------------------------------------------------------------------------
# serve/exposition.py writes a new reading of the same series into the last rendering's text around its
# values, which is only right while the encoders write a plain sample (no timestamp, exemplar or
# native histogram) as "<name>{<labels>} <value>", the value as floatToGoString writes it.

float_text: Callable[[float], str] = floatToGoString
"""A sample value as both encoders write it (``prometheus_client.utils.floatToGoString``, undocumented)."""

# Samples the text-format encoder moves out of their family into a family of their own.
MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")


def sample_parts(metric: Metric) -> Iterator[tuple[str, dict[str, str], float, bool]]:
    """(name, labels, value, plain) of each sample; plain: no timestamp, exemplar or native histogram.

    Read by attribute: ``Sample`` is a named tuple that has grown fields before (six in 0.26).
    """
    for sample in metric.samples:
        plain = sample.timestamp is None and sample.exemplar is None and sample.native_histogram is None
        yield sample.name, sample.labels, sample.value, plain


# The escaping Prometheus 2 negotiates for OpenMetrics; for names that need no escaping it writes the
# same bytes as "allow-utf-8", which does not rewrite every name a character at a time.
OPENMETRICS_UNDERSCORES: str = _openmetrics.UNDERSCORES


def openmetrics_plain_names_encoder(version: str) -> Callable[[Any], bytes]:
    """The OpenMetrics encoder of ``version`` with "allow-utf-8" escaping, for families of plain names."""

    def encode(registry: Any) -> bytes:
        encoded: bytes = _openmetrics.generate_latest(registry, escaping=_openmetrics.ALLOWUTF8, version=version)
        return encoded

    return encode


def parse_text_format(text: str) -> list[Metric]:
    """The families of a text-format body, as ``prometheus_client.parser`` reads them.

    Its quirk the push receiver relies on: ``# TYPE c counter`` over samples named ``c`` gives a
    family ``c`` whose samples are renamed ``c_total`` (the Pushgateway keeps the pushed name).
    """
    from prometheus_client.parser import text_string_to_metric_families  # lazy: only pushes need it

    return list(text_string_to_metric_families(text))


# -- uvicorn 0.54 ----------------------------------------------------------------------------------
# fleetscope.serve.guard.GuardedH11Protocol subclasses uvicorn's h11 protocol
# (uvicorn.protocols.http.h11_impl.H11Protocol, not exported by uvicorn) and relies on: the hooks
# connection_made, connection_lost, data_received and on_response_complete (called once a response
# is sent), and the attributes below. Imported on first use, so only a serving daemon loads uvicorn.


def __getattr__(name: str) -> Any:
    if name == "H11Protocol":
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def client_state(protocol: H11Protocol) -> Any:
    """The client's side of the exchange: an h11 state (``h11.IDLE``, ``h11.SEND_BODY``...)."""
    return protocol.conn.their_state


def open_connections(protocol: H11Protocol) -> Collection[Any]:
    """Every open connection of the protocol's server (one set per listener, shared by its connections)."""
    connections: Collection[Any] = protocol.connections
    return connections


def event_loop(protocol: H11Protocol) -> asyncio.AbstractEventLoop:
    return protocol.loop


def transport(protocol: H11Protocol) -> asyncio.Transport:
    return protocol.transport


def answering(protocol: H11Protocol) -> bool:
    """A response to the request in progress has started."""
    return protocol.cycle is not None and protocol.cycle.response_started


def between_requests(protocol: H11Protocol) -> bool:
    """No request is being answered: none yet, or the last one's response is complete."""
    return protocol.cycle is None or protocol.cycle.response_complete


def abandon_request(protocol: H11Protocol) -> None:
    """Tell the app its client is gone (as uvicorn does when the connection drops): what it sends is dropped."""
    cycle = protocol.cycle
    if cycle is not None and not cycle.response_complete:
        cycle.disconnected = True
        cycle.message_event.set()
