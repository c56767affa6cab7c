"""Serving HTTP with the limits uvicorn leaves out: read deadlines and a connection cap per listener.

uvicorn (h11) waits forever for a client that never finishes its request
line and headers, and for a body that arrives a byte at a time; its only
connection limit (``limit_concurrency``) answers 503 *after* reading a whole
request, so sockets that never send one pile up until the process runs out
of file descriptors, and then ``/metrics``, the probes and every push fail
together. :class:`GuardedH11Protocol` is uvicorn's own h11 protocol with three
additions:

* a request's headers must arrive within ``read_header_timeout`` of its first
  byte (or of the connection opening), and the whole request, body included,
  within ``read_timeout`` (Go's ``ReadHeaderTimeout``/``ReadTimeout``); a late
  client gets ``408`` and the connection is closed;
* at most ``max_connections`` connections per listener, kept below the open
  files limit (raised to its hard limit at start). A connection beyond the cap
  evicts the connection that has waited longest on its client (idle, or
  still sending its request), so a request that arrives whole, such as a
  Prometheus scrape or a kubelet probe, is served even while the listener is
  flooded with slow sockets (a connection that has sent nothing yet is not
  evicted in its first couple of seconds, so a request arriving in a
  connection storm has time to be read; one that has sent part of a request
  and stalls can be evicted at once); when no connection can give way, the new one is refused
  with ``503`` and ``Retry-After``;
* every drop is counted per listener and reason (``fleetscope_http_*``).

uvicorn's keep-alive timeout still closes idle connections between requests,
and h11's 16 KiB cap on a request's head still applies.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any, ClassVar

import h11

from fleetscope.compat import (
    H11Protocol,
    abandon_request,
    answering,
    between_requests,
    client_state,
    event_loop,
    open_connections,
    transport,
)
from fleetscope.serve.listeners import ListenerStats

SHUTDOWN_GRACE = 5  # seconds a stopping daemon waits for requests in progress
# A connection is not evicted in its first seconds: a scrape or probe that arrives during a connection
# storm has that long to send its request before the storm's own connections push it out.
EVICTION_GRACE = 2.0


def _raw_response(status: int, reason: str, message: str, retry_after: int | None = None) -> bytes:
    body = (message + "\n").encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: text/plain; charset=utf-8", "connection: close",
            f"content-length: {len(body)}"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines and a per-listener connection cap (see the module).

    What it reads of uvicorn's protocol goes through :mod:`fleetscope.compat` (``client_state``,
    ``open_connections``, the request cycle's flags): uvicorn does not export this class.
    """

    stats: ClassVar[ListenerStats]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting_since = time.monotonic()
        self._header_timer: asyncio.TimerHandle | None = None
        self._request_timer: asyncio.TimerHandle | None = None
        self._counted = False
        self._heard = False  # bytes of a request arrived since the last response: it is slow, not new

    @classmethod
    def for_listener(cls, stats: ListenerStats) -> type[GuardedH11Protocol]:
        return type(f"GuardedH11Protocol_{stats.name}", (cls,), {"stats": stats})

    # -- connection lifecycle -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._counted = True
        self.stats.opened(1)
        self._waiting_since = time.monotonic()
        self._header_timer = self._arm(self.stats.limits.read_header_timeout, self._header_deadline)
        if len(open_connections(self)) > self.stats.limits.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self._counted:
            self._counted = False
            self.stats.opened(-1)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._heard = True
        self._track_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = time.monotonic()
        self._heard = False
        if client_state(self) is not h11.IDLE:
            self._track_request()  # a pipelined request, or the rest of a body the app did not read

    # -- deadlines ------------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return event_loop(self).call_later(delay, callback)

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._request_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._request_timer = None

    def _track_request(self) -> None:
        """Start or stop the deadlines as the client's side of the exchange moves on."""
        if transport(self).is_closing():
            return
        state = client_state(self)
        if state is h11.IDLE:
            if self._header_timer is None:
                self._header_timer = self._arm(self.stats.limits.read_header_timeout, self._header_deadline)
        elif self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if state is h11.SEND_BODY:
            if self._request_timer is None:
                self._request_timer = self._arm(self.stats.limits.read_timeout, self._request_deadline)
        elif self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        if transport(self).is_closing() or client_state(self) is not h11.IDLE:
            return
        self.stats.drop("read_header_timeout")
        self._close(_raw_response(408, "Request Timeout", "request headers not received in time "
                                  f"(web.read-header-timeout={self.stats.limits.read_header_timeout:g}s)"))

    def _request_deadline(self) -> None:
        self._request_timer = None
        if transport(self).is_closing() or client_state(self) is not h11.SEND_BODY:
            return
        self.stats.drop("read_timeout")
        self._close(None if answering(self) else _raw_response(
            408, "Request Timeout", f"request body not received in time (web.read-timeout="
            f"{self.stats.limits.read_timeout:g}s)"))

    def _close(self, response: bytes | None) -> None:
        """Close the connection now, after ``response`` if the client has not been answered yet."""
        self._cancel_timers()
        abandon_request(self)  # the app sees the client gone; whatever it sends is dropped
        if response is not None:
            transport(self).write(response)
        transport(self).close()

    # -- the connection cap ---------------------------------------------------------------------

    def _waiting_on_client(self) -> bool:
        """Idle, or still sending its request (headers or body); not while its request is being answered."""
        if transport(self).is_closing():
            return False
        state = client_state(self)
        if state is h11.IDLE:
            return between_requests(self)
        return state is h11.SEND_BODY and not between_requests(self) and not answering(self)

    def _make_room(self) -> None:
        """Close the connection that has waited longest on its client.

        One that has sent part of a request and stalls is fair game at once; one that has sent nothing yet
        gets EVICTION_GRACE to send its request, so a scrape arriving in a storm is read before it is pushed out.
        """
        victim: GuardedH11Protocol | None = None
        young = time.monotonic() - EVICTION_GRACE
        oldest = math.inf
        for other in open_connections(self):
            if other is self or not isinstance(other, GuardedH11Protocol):
                continue
            since = other._waiting_since
            if since < oldest and (other._heard or since <= young) and other._waiting_on_client():
                oldest, victim = since, other
        if victim is not None:
            self.stats.drop("evicted")
            victim._close(None)
            return
        self.stats.drop("over_limit")
        self._close(_raw_response(503, "Service Unavailable", "too many connections "
                                  f"(web.max-connections={self.stats.limits.max_connections})", retry_after=1))


def uvicorn_config(app: Any, address: tuple[str, int], stats: ListenerStats, log_level: str) -> Any:
    """A ``uvicorn.Config`` serving ``app`` on ``address`` through :class:`GuardedH11Protocol`.

    uvicorn's own logging setup is skipped (``log_config=None``) so its records reach the daemon's
    handler, which rate-limits repeated lines.
    """
    import uvicorn

    host, port = address
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=False, lifespan="off", workers=1,
        http=GuardedH11Protocol.for_listener(stats), log_config=None, backlog=stats.limits.backlog,
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
