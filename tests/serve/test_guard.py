"""HTTP serving limits: read deadlines, the connection cap and its fit to the open files limit (a real daemon)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from fleetscope.collectors.http import HttpCollector
from fleetscope.collectors.steps import StepsCollector
from fleetscope.config import load
from fleetscope.logs import RepeatFilter
from fleetscope.serve.daemon import Daemon, build_daemon
from fleetscope.serve.guard import EVICTION_GRACE
from fleetscope.serve.listeners import MAX_BACKLOG, MIN_BACKLOG, RESERVED_FDS, ListenerLimits, fit_to_open_files
from fleetscope_sim.harness import eventually


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start a real daemon with ``settings`` on a port the kernel chooses; returns its base URL."""
    started: list[tuple[Daemon, threading.Thread]] = []

    def start(**settings: str) -> str:
        ready = tmp_path / f"ready-{len(started)}.json"
        config = load({"web.listen-address": "127.0.0.1:0", "web.ready-file": str(ready), **settings}, environ={})
        daemon = build_daemon(config, collectors={"http": HttpCollector(config), "steps": StepsCollector(config)})
        thread = threading.Thread(target=asyncio.run, args=(daemon.serve(),), daemon=True)
        thread.start()
        started.append((daemon, thread))
        bound = eventually(lambda: ready.exists() and json.loads(ready.read_text()), 60, "the daemon to listen")
        return f"http://{bound['main']}"

    yield start
    for daemon, thread in started:
        daemon.request_stop()
        thread.join(10)


@pytest.fixture
def daemon(serve: Callable[..., str]) -> tuple[str, None]:
    return serve(**{"web.read-header-timeout": "1s", "web.read-timeout": "2s", "web.max-connections": "20"}), None


def connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (b"" if it closes without a word)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def dropped(base: str, reason: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    line = f'fleetscope_http_connections_dropped_total{{listener="main",reason="{reason}"}} '
    return float(text.split(line, 1)[1].split()[0])


def test_client_that_never_finishes_its_headers_gets_408(daemon) -> None:
    base, _ = daemon
    for opening in (b"", b"GET /metrics HTTP/1.1\r\nHost: x\r\n"):  # silent, or headers never ended
        sock = connect(base)
        sock.sendall(opening)
        reply = answer(sock)  # no byte more is sent: the 408 is the server giving up on its own
        assert reply.startswith(b"HTTP/1.1 408 ") and b"web.read-header-timeout=1s" in reply
    assert dropped(base, "read_header_timeout") == 2


def test_slow_body_is_cut_at_the_read_timeout(daemon) -> None:
    base, _ = daemon
    sock = connect(base)
    sock.sendall(b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n[")
    reply = answer(sock)  # no byte more is sent: the 408 is the server giving up on its own
    assert reply.startswith(b"HTTP/1.1 408 ") and b"web.read-timeout=2s" in reply
    assert dropped(base, "read_timeout") == 1
    metrics = httpx.get(base + "/metrics", timeout=10).text
    assert 'fleetscope_push_rejected_total{reason="incomplete"} 1.0' in metrics


def test_at_the_cap_the_longest_waiting_connection_makes_room(serve) -> None:
    base = serve(**{"web.read-header-timeout": "60s", "web.max-connections": "20"})
    stalled = [connect(base) for _ in range(20)]
    for sock in stalled:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # never finished
    time.sleep(EVICTION_GRACE + 0.5)
    # A whole request still gets through at the cap: the oldest stalled connection gives way.
    response = httpx.get(base + "/healthz", timeout=5)
    assert response.status_code == 200
    assert dropped(base, "evicted") >= 1
    stalled[0].settimeout(5)
    assert answer(stalled[0]) == b""  # closed without an answer: it never asked anything
    for sock in stalled:
        sock.close()


def test_a_connection_storm_cannot_push_out_a_request_in_its_first_seconds(serve) -> None:
    base = serve(**{"web.read-header-timeout": "60s", "web.max-connections": "20"})
    stalled = [connect(base) for _ in range(20)]  # the cap, all of them young
    time.sleep(0.2)
    refused = connect(base)
    assert answer(refused).startswith(b"HTTP/1.1 503 ")  # nobody may be evicted yet: the newcomer is refused
    time.sleep(EVICTION_GRACE + 0.5)
    assert dropped(base, "over_limit") >= 1  # now the oldest stalled connection makes room for this scrape
    for sock in stalled:
        sock.close()


@pytest.mark.parametrize(("open_files", "listeners"), [(1024, 1), (1024, 2), (4096, 2), (65536, 2), (200, 1)])
def test_cap_and_backlog_fit_the_open_files_limit(open_files: int, listeners: int) -> None:
    fitted = fit_to_open_files(ListenerLimits(512, 10, 30), listeners, open_files)
    assert MIN_BACKLOG <= fitted.backlog <= MAX_BACKLOG
    if open_files >= 1024:
        # Every listener's cap plus the connections asyncio accepts before counting them stay under the limit.
        assert listeners * (fitted.max_connections + 4 * fitted.backlog) + RESERVED_FDS <= open_files
    assert fitted.max_connections == (512 if open_files >= 65536 else fitted.max_connections)
    assert 16 <= fitted.max_connections <= 512
    assert fit_to_open_files(ListenerLimits(0, 10, 30), 1, 65536).max_connections > 512  # 0: what fits


def test_repeated_log_lines_are_rate_limited() -> None:
    now = [0.0]
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("fleetscope.test.flood")
    handler = Keep()
    handler.addFilter(RepeatFilter(burst=5, window=60, clock=lambda: now[0]))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(10_000):
            logger.error("socket.accept() out of system resource (fd %d)", i)
        logger.warning("another kind of line")
        assert len(records) == 6 and records[-1] == "another kind of line"
        now[0] = 61.0
        logger.error("socket.accept() out of system resource (fd %d)", 10_000)
        assert records[-1] == "socket.accept() out of system resource (fd 10000) [9995 more like this dropped]"
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
