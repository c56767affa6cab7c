"""A real daemon (uvicorn on 127.0.0.1, ephemeral port) for tests that push over HTTP."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleetscope.clock import Clock
from fleetscope.collectors.steps import StepsCollector
from fleetscope.config import load
from fleetscope.serve.daemon import build_daemon


@dataclass
class LiveDaemon:
    url: str
    collector: StepsCollector

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """/metrics over HTTP, as {(sample name, sorted labels): value}."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        for (sample, sample_labels), value in self.scrape().items():
            if sample == name and all(dict(sample_labels).get(k) == v for k, v in labels.items()):
                return value
        return None


@contextmanager
def running_daemon(
    flags: dict[str, Any] | None = None,
    clock: Clock | None = None,
    port: int = 0,
) -> Iterator[LiveDaemon]:
    import uvicorn

    config = load(flags=flags or {}, environ={})
    collector = StepsCollector(config, clock=clock)
    daemon = build_daemon(config, collectors={"steps": collector})
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(daemon.app, log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test daemon did not start")
        time.sleep(0.01)
    try:
        yield LiveDaemon(f"http://127.0.0.1:{port}", collector)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
