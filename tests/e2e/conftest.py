from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import free_port_run, require_binary


@pytest.fixture(scope="session")
def port_run() -> Callable[[int], int]:
    return free_port_run


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return require_binary("prometheus")
