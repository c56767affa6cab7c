from __future__ import annotations

import pathlib
import shutil
from collections.abc import Iterator

import pytest

from fleetscope_sim.tree import make_workdir


@pytest.fixture
def scratch() -> Iterator[pathlib.Path]:
    """A directory on tmpfs when there is one: node trees rewrite hundreds of files a tick."""
    path = make_workdir("fleetscope-test-")
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)
