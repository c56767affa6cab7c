from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
# The fixture trees hold no tests, and their sysfs links loop (a device's `device` link points back up
# to its PCI function, which holds the device): walking them kept collection busy for minutes.
collect_ignore = ["fixtures"]


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No FLEETSCOPE_* variable from the caller's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("FLEETSCOPE_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """A command run in a test (setup_logging) leaves no handler on a capture stream pytest closes after it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port: int, timeout: float = 10.0) -> str:
    """The base URL of a daemon on 127.0.0.1:``port``, once its /healthz answers (or ``timeout`` passed)."""
    import httpx

    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/healthz", timeout=0.5)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    return base


# Port runs are probed below the kernel's ephemeral range (32768-60999 by default), where no outgoing
# connection or bind(0) lands; each pytest-xdist worker probes its own slice, so two workers never
# probe the same ports at the same moment and both take them.
PORT_RUNS = (21000, 32700)


def _worker_slice() -> tuple[int, int]:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    span = (PORT_RUNS[1] - PORT_RUNS[0]) // max(workers, 1)
    return PORT_RUNS[0] + worker * span, PORT_RUNS[0] + (worker + 1) * span


def free_port_run(count: int) -> int:
    """The first port of ``count`` consecutive free ports (probed, not reserved) in this worker's slice."""
    start, end = _worker_slice()
    for base in range(start, end - count, count + 13):
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                sockets.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free ports")


def require_binary(name: str) -> str:
    """Path of a binary the test needs; in CI a missing one fails instead of skipping."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required in CI but not installed")
        pytest.skip(f"{name} not installed")
    return path
