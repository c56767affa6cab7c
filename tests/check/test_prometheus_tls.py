"""How ``check`` reaches a Prometheus behind TLS and auth: a CA file, a bearer token file, basic auth (#35 item 10).

The server is a TLS socket on 127.0.0.1 with a certificate from trustme; it records the Authorization
header each request carried and answers that the node is a known, healthy target.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trustme

from fleetscope.check.prometheus import cross_node_findings
from fleetscope.config import load
from tests.check.test_broken_prometheus import answer, read_request

UP = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": "up", "instance": "n1", "job": "fleetscope"}, "value": [time.time(), "1"]}]}}


@pytest.fixture
def tls_prometheus(tmp_path) -> Iterator[dict[str, Any]]:
    ca = trustme.CA()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    seen: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                with context.wrap_socket(raw, server_side=True) as conn:
                    head = read_request(conn).partition(b"\r\n\r\n")[0].decode("latin-1")
                    seen.append(next((line.split(":", 1)[1].strip() for line in head.split("\r\n")
                                      if line.lower().startswith("authorization:")), ""))
                    conn.sendall(answer(json.dumps(UP).encode()))
            except (OSError, ssl.SSLError):
                continue

    threading.Thread(target=serve, daemon=True).start()
    yield {"url": f"https://127.0.0.1:{listener.getsockname()[1]}", "ca": str(tmp_path / "ca.pem"), "seen": seen,
           "dir": tmp_path}
    stop.set()
    listener.close()


def ask(server: dict[str, Any], **settings: str) -> list[tuple[str, str]]:
    # check.prometheus-timeout as a hang guard (its 2 s default would judge a TLS handshake on a loaded machine)
    config = load({"check.prometheus-url": server["url"], "check.instance": "n1", "check.prometheus-timeout": "240",
                   **settings}, environ={})
    return [(f.severity, f.message) for f in cross_node_findings(config.check, time.monotonic() + 240)]


def test_a_ca_file_a_bearer_token_file_and_basic_auth(tls_prometheus) -> None:
    server, directory = tls_prometheus, tls_prometheus["dir"]
    (severity, message), = ask(server)  # the system's CAs do not know trustme's
    assert severity == "unknown" and "CERTIFICATE_VERIFY_FAILED" in message
    (directory / "token").write_text("t0ken\n")
    assert ask(server, **{"check.prometheus-ca-file": server["ca"],
                          "check.prometheus-bearer-token-file": str(directory / "token")}) == []
    assert server["seen"][-1] == "Bearer t0ken"
    (directory / "password").write_text("pa55\n")
    assert ask(server, **{"check.prometheus-ca-file": server["ca"], "check.prometheus-username": "fleetscope",
                          "check.prometheus-password-file": str(directory / "password")}) == []
    assert server["seen"][-1] == "Basic ZmxlZXRzY29wZTpwYTU1"  # fleetscope:pa55
    (severity, message), = ask(server, **{"check.prometheus-ca-file": server["ca"],
                                          "check.prometheus-bearer-token-file": str(directory / "absent")})
    assert severity == "unknown" and message.startswith("Prometheus check.prometheus-bearer-token-file: cannot read")
