from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from tests.conftest import require_binary


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
    return require_binary("prometheus")
