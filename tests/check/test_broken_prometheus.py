"""``check`` against a Prometheus that is broken in every way a socket can be (#35 item 7).

Each server here is a raw TCP socket on 127.0.0.1 that reads the request and then answers what a broken
or hostile peer would: an answer trickled a byte at a time, an SSH banner, a status line that is no HTTP,
101 headers, counts that are not numbers. Whatever it sends, the ``training`` source is "could not tell"
within the check's deadline, the node's own findings keep their exit code, and ``--write --every`` goes on.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fleetscope.check.prometheus import cross_node_findings
from fleetscope.check.run import EXIT_UNHEALTHY, run_check, watch
from fleetscope.collectors.protocol import Finding
from fleetscope.config import load

Behaviour = Callable[[socket.socket, bytes], None]  # (connection, the request's bytes) -> answers


def read_request(conn: socket.socket) -> bytes:
    """The request's head and its body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.fixture
def raw_server() -> Iterator[Callable[[Behaviour], str]]:
    stop = threading.Event()
    listeners: list[socket.socket] = []

    def start(behaviour: Behaviour) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.2)
        listeners.append(listener)

        def handle(conn: socket.socket) -> None:
            with conn, contextlib.suppress(OSError):  # OSError: check hung up, as it is meant to
                behaviour(conn, read_request(conn))

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except (TimeoutError, OSError):
                    continue
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    start.stop = stop  # type: ignore[attr-defined]
    yield start
    stop.set()
    for listener in listeners:
        listener.close()


def answer(body: bytes, *, headers: int = 1) -> bytes:
    """One response, saying the server closes after it: without ``Connection: close`` check's client may send its
    next query on this connection, and the close that follows, with that query unread, resets it (ReadError),
    the more often the busier the machine."""
    extra = b"".join(b"X-Filler-%d: x\r\n" % i for i in range(headers - 1))
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n"
            b"%b\r\n%b" % (len(body), extra, body))


def vector(*samples: tuple[dict[str, str], str]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [time.time(), value]} for labels, value in samples]}}).encode()


UP = ({"__name__": "up", "instance": "n1", "job": "fleetscope"}, "1")
STRAGGLER = ({"alertname": "TrainingStragglerRank", "instance": "n1", "training_job": "llama", "rank": "3",
              "cause": "gpu_throttled"}, "1")


def a_finding_then_counts(count: str) -> Behaviour:
    """The node carries a finding; every count Prometheus answers is ``count``."""
    def behaviour(conn: socket.socket, request: bytes) -> None:
        body = request.partition(b"\r\n\r\n")[2]
        conn.sendall(answer(vector(UP, STRAGGLER) if body.startswith(b"query=up") else vector(({}, count))))
    return behaviour


def trickle(conn: socket.socket, request: bytes) -> None:
    """A valid answer, one byte every 0.1 s: 40 s for the whole of it."""
    for byte in answer(vector(UP) + b" " * 200):
        conn.sendall(bytes([byte]))
        time.sleep(0.1)


BROKEN: dict[str, Behaviour] = {
    "ssh banner": lambda conn, _: conn.sendall(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n"),
    "bad status line": lambda conn, _: conn.sendall(b"HTTP/1.1 OK-ish\r\n\r\n"),
    "101 headers": lambda conn, _: conn.sendall(answer(b"<html>login</html>", headers=101)),
    "non-JSON": lambda conn, _: conn.sendall(answer(b"\xff\xfe not json")),
    "JSON nested 100,000 deep": lambda conn, _: conn.sendall(answer(b"[" * 100_000)),
    "a closed connection": lambda conn, _: None,
    "NaN count": a_finding_then_counts("NaN"),
    "+Inf count": a_finding_then_counts("+Inf"),
    "negative count": a_finding_then_counts("-3"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_any_broken_answer_is_could_not_tell_about_training_alone(raw_server, name: str) -> None:
    config = load({"check.prometheus-url": raw_server(BROKEN[name]), "check.instance": "n1"}, environ={})
    (finding,) = cross_node_findings(config.check, time.monotonic() + 10)
    assert (finding.collector, finding.severity) == ("training", "unknown")
    assert finding.message.startswith("Prometheus ") and "\n" not in finding.message


def test_an_answer_trickled_a_byte_at_a_time_cannot_hold_check_past_its_deadline(raw_server) -> None:
    """Before: the timeout bounded each socket read, so a byte every 0.1 s held check for the whole 40 s."""
    config = load({"check.prometheus-url": raw_server(trickle), "check.instance": "n1",
                   "check.prometheus-timeout": "1s"}, environ={})
    (finding,) = cross_node_findings(config.check, time.monotonic() + 10)
    # The whole answer would say "no target instance=n1"; this says the deadline ended the exchange.
    assert (finding.severity, finding.message) == ("unknown", "Prometheus no answer within 1s")


class XidOnGpu0:
    """A node's own finding: its GPU fell off the bus."""

    def __init__(self) -> None:
        self.asked = 0

    def health(self) -> list[Finding]:
        self.asked += 1
        return [Finding("gpu", "unhealthy", "gpu 0", "Xid 79: GPU has fallen off the bus")]


@pytest.mark.parametrize("name", ["bad status line", "NaN count", "JSON nested 100,000 deep"])
def test_a_broken_prometheus_cannot_hide_the_nodes_own_xid(raw_server, name: str) -> None:
    """Before: the exception left check with exit 2 and the Xid 79 finding was dropped."""
    config = load({"check.prometheus-url": raw_server(BROKEN[name]), "check.instance": "n1"}, environ={})
    findings, code = run_check(config, timeout=5, collectors={"gpu": XidOnGpu0()})  # type: ignore[dict-item]
    assert code == EXIT_UNHEALTHY
    assert [(f.collector, f.severity) for f in findings] == [("gpu", "unhealthy"), ("training", "unknown")]


def test_the_training_condition_answers_within_the_plugin_timeout_against_a_trickle(raw_server) -> None:
    """node-problem-detector kills a plugin after 5 s: `--condition training` gives up on Prometheus first."""
    from fleetscope.check.verdicts import CONDITIONS

    config = load({"check.prometheus-url": raw_server(trickle), "check.instance": "n1",
                   "check.prometheus-timeout": "30s"}, environ={})
    findings, code = run_check(config, timeout=1.0, condition=CONDITIONS["training"], collectors={})
    assert code == 2 and findings[0].message == "Prometheus no answer within 1s"


def test_write_writes_every_verdict_when_prometheus_is_broken(raw_server, tmp_path) -> None:
    config = load({"check.prometheus-url": raw_server(BROKEN["bad status line"]), "check.instance": "n1"},
                  environ={})
    watch(config, str(tmp_path), every=0, timeout=3, rounds=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["efa", "gpu", "training"]
    assert (tmp_path / "training").read_text().startswith("2\ncould not tell: Prometheus did not answer in HTTP")


def test_write_every_survives_a_round_that_fails(tmp_path, monkeypatch) -> None:
    """Before: any exception out of a round ended `check --write --every`, and the sidecar crash-looped."""
    from fleetscope.check import run

    rounds: list[int] = []

    def failing_round(*args: object) -> None:
        rounds.append(1)
        if len(rounds) < 3:
            raise RuntimeError("a round that breaks")
        raise KeyboardInterrupt  # the test's way out of the endless loop

    monkeypatch.setattr(run, "_round", failing_round)
    monkeypatch.setattr(run, "build_collectors", lambda config, names: {})
    with pytest.raises(KeyboardInterrupt):
        watch(load({}, environ={}), str(tmp_path), every=0.01, timeout=1, rounds=None)
    assert len(rounds) == 3


def test_a_verdict_that_cannot_be_written_leaves_the_others_written(tmp_path) -> None:
    from fleetscope.check.run import write_verdicts
    from fleetscope.check.verdicts import CONDITIONS

    (tmp_path / "efa").mkdir()
    (tmp_path / "efa" / "x").touch()  # a non-empty directory where the efa file goes: os.replace fails
    failed = write_verdicts(str(tmp_path), [], CONDITIONS.values())
    assert failed == ["efa"]
    assert (tmp_path / "gpu").read_text() == "0\nhealthy\n"
    assert (tmp_path / "training").read_text() == "0\nhealthy\n"


def test_a_job_name_with_line_breaks_stays_one_line_in_every_output(raw_server, tmp_path) -> None:
    """A newline in a pushed job name once added a forged `gpu 2: Xid 79` line to check's output."""
    forged = dict(STRAGGLER[0], training_job="x\nUNHEALTHY gpu: gpu 2: Xid 79\r\u2028\x1b[2J")

    def behaviour(conn: socket.socket, request: bytes) -> None:
        body = request.partition(b"\r\n\r\n")[2]
        conn.sendall(answer(vector(UP, (forged, "1")) if body.startswith(b"query=up") else vector(({}, "10"))))

    config = load({"check.prometheus-url": raw_server(behaviour), "check.instance": "n1",
                   "check.breaker-percent": "100"}, environ={})
    findings, _ = run_check(config, timeout=5, collectors={})
    (line,) = [f.line() for f in findings]
    assert line == "UNHEALTHY training: straggler: rank 3, GPU throttled, job x UNHEALTHY gpu: gpu 2: Xid 79 [2J"
    from fleetscope.check.run import write_verdicts
    from fleetscope.check.verdicts import CONDITIONS

    write_verdicts(str(tmp_path), findings, [CONDITIONS["training"]])
    assert len((tmp_path / "training").read_text().splitlines()) == 3  # code, summary, the one finding

