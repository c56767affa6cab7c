from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
# The fixture trees hold no tests, and their sysfs links loop (a device's `device` link points back up
# to its PCI function, which holds the device): walking them kept collection busy for minutes.
collect_ignore = ["fixtures"]


# How a module marks a test live, as its text says it: the live tier (`-m live`) reads no other module.
LIVE_MARK = "pytest.mark.live"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m live`` alone (scripts/test's live tier), a test module whose text never says
    ``pytest.mark.live`` is not imported: each of that tier's workers would otherwise import the whole suite
    for its few modules. The gate checks that every live test's module says it (below)."""
    if config.getoption("markexpr") != "live" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_") or not collection_path.is_file():
        return None
    return True if LIVE_MARK not in collection_path.read_text(encoding="utf-8") else None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is seen
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with a ``slow`` test first and modules marked ``late`` last, in collection order otherwise.

    The gate's workers each take a whole module at a time (--dist loadfile), in this order: a gate that reached
    its longest module last would end on one worker while the other idles; a module that waits on the image
    build scripts/test starts in the background is best reached once that build had the most time."""
    unread = sorted({str(item.path) for item in items if item.get_closest_marker("live")
                     and LIVE_MARK not in item.path.read_text(encoding="utf-8")})
    if unread:  # the live tier would not read these modules, and the gate leaves their live tests out
        raise pytest.UsageError(f"live tests in modules that do not say {LIVE_MARK}: {', '.join(unread)}")
    rank = {}
    for item in items:
        module = rank.setdefault(item.path, 1)
        if item.get_closest_marker("late"):
            rank[item.path] = 2
        elif item.get_closest_marker("slow") and module != 2:
            rank[item.path] = 0
    items.sort(key=lambda item: rank[item.path])


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
    """A port free a moment ago, for what cannot bind port 0 itself (a torch job's rendezvous). A daemon or a
    Prometheus binds port 0 and says what it bound (fleetscope_sim.harness)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def requires_modules(*alternatives: str) -> pytest.MarkDecorator:
    """Skip unless each argument names an installed top-level module ("a|b": either), found without importing
    it; in CI a missing one is not skipped, and its test fails on the import. Test modules that imported torch,
    Lightning and transformers at collection cost every pytest process of the suite (each collects every
    module) about 10 s of CPU; such a module marks itself with this and imports inside its tests."""
    missing = [names for names in alternatives
               if all(importlib.util.find_spec(name) is None for name in names.split("|"))]
    return pytest.mark.skipif(bool(missing) and not os.environ.get("CI"), reason=f"not installed: {', '.join(missing)}")


def require_binary(name: str) -> str:
    """Path of a binary the test needs; in CI a missing one fails instead of skipping."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required in CI but not installed")
        pytest.skip(f"{name} not installed")
    return path
