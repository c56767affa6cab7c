from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability.processes import Daemon, Pushgateway


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(flags: dict[str, str] | None = None, open_files: int | None = None) -> Daemon:
        built = Daemon.on_p5(tmp_path, flags, open_files).start()
        started.append(built)
        return built

    yield start
    for built in started:
        built.stop()


@pytest.fixture(scope="module")
def pushgateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushgateway]:
    gateway = Pushgateway(tmp_path_factory.mktemp("pushgateway"))
    gateway.start()
    yield gateway
    gateway.stop()
