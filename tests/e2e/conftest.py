from __future__ import annotations

import shutil
import socket
from collections.abc import Callable

import pytest


def free_port_run(count: int, start: int = 21000) -> int:
    """The first port of ``count`` consecutive free ports (probed, not reserved)."""
    for base in range(start, 60000, count + 13):
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


@pytest.fixture(scope="session")
def port_run() -> Callable[[int], int]:
    return free_port_run


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus server is not installed (Debian package prometheus)")
    return binary
