from __future__ import annotations

import logging
import socket
import time

import pytest

from fleetscope.client.sender import RecordBuffer, Sender
from fleetscope_sim.harness import eventually
from tests.conftest import free_port
from tests.push.live import running_daemon


def wait_for(condition, timeout: float = 240.0) -> bool:  # type: ignore[no-untyped-def]
    """A hang guard: returns once ``condition`` holds, within at least 240 s however small ``timeout`` is."""
    return bool(eventually(condition, max(timeout, 240.0), interval=0.02))


def test_buffer_drops_oldest_and_counts() -> None:
    buffer = RecordBuffer(3)
    for i in range(5):
        buffer.put({"i": i})
    assert buffer.dropped == 2 and buffer.enqueued == 5
    assert [r["i"] for r in buffer.take(10)] == [2, 3, 4]


def test_given_back_batch_goes_first_and_only_its_oldest_overflow() -> None:
    buffer = RecordBuffer(4)
    for i in range(3):
        buffer.put({"i": i})
    batch = buffer.take(3)
    buffer.put({"i": 3})
    buffer.put({"i": 4})
    assert buffer.stats(0).pending == 5  # two queued, three in flight
    buffer.give_back(batch)  # room for 2 of the 3: record 0, the oldest, is dropped
    stats = buffer.stats(0)
    assert (stats.dropped, stats.pending) == (1, 4)
    assert [r["i"] for r in buffer.take(10)] == [1, 2, 3, 4]


def test_settled_batches_are_counted_as_sent_or_rejected() -> None:
    buffer = RecordBuffer(10)
    for i in range(5):
        buffer.put({"i": i})
    buffer.settle(buffer.take(3), delivered=True)
    buffer.settle(buffer.take(1), delivered=False)
    stats = buffer.stats(0)
    assert (stats.enqueued, stats.sent, stats.rejected, stats.pending, stats.dropped) == (5, 3, 1, 1, 0)


def test_sender_retries_until_the_daemon_comes_up() -> None:
    port = free_port()
    sender = Sender(
        f"http://127.0.0.1:{port}", batch_size=10, flush_interval=0.05, timeout=1.0, max_backoff=0.2
    )
    for step in range(25):
        sender.put({"job": "late", "rank": 0, "step": step, "step_seconds": 0.5})
    assert wait_for(lambda: sender.stats().failures >= 1)
    with running_daemon(port=port) as daemon:
        assert wait_for(lambda: sender.stats().sent == 25)
        assert daemon.value("fleetscope_training_steps_total", training_job="late") == 25
    stats = sender.stats()
    assert (stats.dropped, stats.rejected, stats.pending) == (0, 0, 0)
    sender.close(1)


def test_refused_records_are_dropped_not_retried_forever() -> None:
    with running_daemon() as daemon:
        sender = Sender(daemon.url, batch_size=5, flush_interval=0.05)
        sender.put({"job": "bad", "rank": -1, "step": 0, "step_seconds": 1})
        sender.put({"job": "bad", "rank": 0, "step": 0, "step_seconds": 1})
        sender.close(10)
        stats = sender.stats()
        assert (stats.sent, stats.rejected, stats.pending) == (0, 2, 0)  # the batch is all-or-nothing
        assert daemon.value("fleetscope_push_rejected_total", reason="invalid") == 1


def test_token_is_sent() -> None:
    with running_daemon({"push.token": "t0ken"}) as daemon:
        good = Sender(daemon.url, token="t0ken")
        good.put({"job": "auth", "rank": 0, "step": 1, "step_seconds": 1})
        good.close(10)
        assert good.stats().sent == 1
        bad = Sender(daemon.url, token="wrong")
        bad.put({"job": "auth", "rank": 0, "step": 2, "step_seconds": 1})
        bad.close(10)
        assert bad.stats().rejected == 1


def test_a_token_written_with_a_trailing_newline_delivers_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """#30 item 6: `echo s3cret > file` gives "s3cret\\n"; the header refused it and the client retried forever."""
    from fleetscope.client import StepTracker

    with running_daemon({"push.token": "s3cret"}) as daemon:
        monkeypatch.setenv("FLEETSCOPE_PUSH_TOKEN", "s3cret\n")
        tracker = StepTracker(job="newline", rank=0, url=daemon.url, flush_interval=0.05)
        for step in range(20):
            tracker.report(0.1, step=step + 1)
        tracker.close(10)
        stats = tracker.stats()
        assert (stats.sent, stats.pending, stats.error) == (20, 0, None)
        assert daemon.value("fleetscope_training_steps_total", training_job="newline", rank="0", local_rank="",
                            pp_stage="") == 20


def test_a_token_no_header_can_carry_is_a_permanent_error_in_stats_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with running_daemon({"push.token": "s3cret"}) as daemon:
        sender = Sender(daemon.url, token="s3c\nret", flush_interval=0.05, max_backoff=0.1)
        with caplog.at_level(logging.ERROR, logger="fleetscope.client"):
            for step in range(5):
                sender.put({"job": "bad-token", "rank": 0, "step": step + 1, "step_seconds": 1})
            sender.close(10)
    stats = sender.stats()
    assert (stats.sent, stats.rejected, stats.pending) == (0, 5, 0)  # given up, not retried forever
    assert stats.error is not None and "token" in stats.error
    assert [r for r in caplog.records if r.levelno == logging.ERROR and "cannot push" in r.getMessage()]


def test_a_refused_token_is_the_error_in_stats() -> None:
    with running_daemon({"push.token": "s3cret"}) as daemon:
        sender = Sender(daemon.url, token="wrong")
        sender.put({"job": "auth", "rank": 0, "step": 1, "step_seconds": 1})
        sender.close(10)
    assert sender.stats().error == "the daemon refused the push token (401)"


def test_pushes_share_one_kept_alive_connection_and_survive_an_idle_close() -> None:
    import http.server
    import socketserver
    import threading as _threading

    from fleetscope.client.sender import Sender

    connections: list[int] = []
    records: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            connections.append(1)

        def do_POST(self) -> None:
            import json

            body = self.rfile.read(int(self.headers["Content-Length"]))
            records.extend(r["step"] for r in json.loads(body))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            if len(records) == 5:
                # Close without saying so, as a server does with an idle keep-alive connection.
                self.close_connection = True

        def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    _threading.Thread(target=server.serve_forever, daemon=True).start()
    sender = Sender(f"http://127.0.0.1:{server.server_address[1]}", batch_size=1, flush_interval=0.01)
    try:
        for step in range(5):
            sender.put({"job": "j", "rank": 0, "step": step, "step_seconds": 0.1})
            assert wait_for(lambda n=step: len(records) == n + 1, 10)
        assert len(connections) == 1
        # The server drops the idle connection (as uvicorn does after its keep-alive timeout):
        # the next push reconnects once and nothing is lost or sent twice.
        time.sleep(0.2)  # let the server's close reach the client's socket
        sender.put({"job": "j", "rank": 0, "step": 5, "step_seconds": 0.1})
        assert wait_for(lambda: len(records) == 6, 10)
        assert records == [0, 1, 2, 3, 4, 5]
        assert len(connections) == 2
    finally:
        sender.close()
        server.shutdown()
        server.server_close()


class _StallingDaemon:
    """A push endpoint that stores the first push, then answers the next ``stalls`` pushes too late."""

    def __init__(self, stalls: int, stall_seconds: float) -> None:
        import http.server
        import threading

        self.records: list[dict] = []  # type: ignore[type-arg]
        self.requests = 0
        daemon = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                import json

                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                daemon.requests += 1
                if 1 < daemon.requests <= 1 + stalls:
                    time.sleep(stall_seconds)  # the client has timed out by now: this push is not stored
                    return
                daemon.records.extend(body if isinstance(body, list) else [])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_close_retries_a_daemon_that_answered_before_until_its_deadline() -> None:
    """A loaded node's daemon misses two pushes while the job exits: close(10) still delivers the last steps."""
    daemon = _StallingDaemon(stalls=2, stall_seconds=0.6)
    try:
        sender = Sender(daemon.url, batch_size=100, flush_interval=0.05, timeout=0.3)
        sender.put({"job": "slow", "rank": 0, "step": 1, "step_seconds": 1})
        assert wait_for(lambda: sender.stats().sent == 1)
        for step in range(2, 6):
            sender.put({"job": "slow", "rank": 0, "step": step, "step_seconds": 1})
        sender.close(10)
        stats = sender.stats()
        assert (stats.sent, stats.pending) == (5, 0), stats
        assert [r["step"] for r in daemon.records] == [1, 2, 3, 4, 5]
        assert daemon.requests == 4  # one stored, two timed out, the last one stored
    finally:
        daemon.stop()


def test_close_gives_a_daemon_never_reached_one_attempt() -> None:
    """A job on a node without the daemon must not wait close()'s whole timeout at every exit."""
    with socket.socket() as nobody:  # bound, never listening: a connection is refused, and the port stays ours
        nobody.bind(("127.0.0.1", 0))
        sender = Sender(f"http://127.0.0.1:{nobody.getsockname()[1]}", flush_interval=60, timeout=0.5)
        sender.put({"job": "alone", "rank": 0, "step": 1, "step_seconds": 1})
        sender.close(10)
    stats = sender.stats()
    assert (stats.pending, stats.failures) == (1, 1), stats  # one refused connection, not ten seconds of retries


def test_a_daemon_that_trickles_its_answer_cannot_hold_delivery(tmp_path) -> None:
    """The socket timeout bounds each read; one deadline bounds the whole exchange (#35, minor)."""
    import socket as socket_module
    import threading as threading_module

    from fleetscope.client.sender import Sender
    server = socket_module.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    stop = threading_module.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
            if stop.wait(0.05):
                break
            try:
                conn.send(bytes([byte]))
            except OSError:
                break
        conn.close()

    thread = threading_module.Thread(target=trickle, daemon=True)
    thread.start()
    sender = Sender(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=0.5)
    try:
        assert sender._deliver([{"job": "j", "rank": 0, "step": 1, "step_seconds": 1.0}], None) is None  # retry
    finally:
        stop.set()
        sender.abandon()
        server.close()
        thread.join(5)
