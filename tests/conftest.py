from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator
from typing import Any

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


# pytest-xdist, as scripts/test runs the suite (``-n N --dist loadgroup``). A module is one unit of work, so a
# module- or session-scoped fixture (a Prometheus run, a built wheel) is set up once, in one worker, and a
# module's tests never overlap each other; modules named together in SHARED_WORKER are one unit, run one
# after the other. (xdist's own loadgroup reads xdist_group marks through a node id that pytest 9.2 no longer
# lets a plugin rewrite, so the grouping is declared here, where the controller, which collects nothing,
# can read it.) Workers take units in collection order, and the end-to-end modules come first.
SHARED_WORKER: dict[str, str] = {}  # module path -> group name


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        first_round = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SHARED_WORKER.get(module, module)

        def schedule(self) -> None:
            self.first_round = self.collection is None
            try:
                super().schedule()
            finally:
                self.first_round = False

        def _assign_work_unit(self, node: Any) -> None:
            # xdist gives each worker a second unit at once (a worker holds its last test until it knows what
            # comes next). In the first round that look-ahead comes from the end of the queue, a short module:
            # taken from the front, one long unit would wait minutes behind another on the same worker.
            if self.first_round and self.assigned_work.get(node) and len(self.workqueue) > 1:
                self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # collection order: the longest units first
    return ModuleScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_cost_class)


# The real torch.distributed runs start first, together: TrainingJobSlowdown compares a job's steps with its
# own 3 minutes earlier, so a job that starts amid the suite's busiest moment keeps a conservative baseline, and
# a run started minutes later beside it (32 torch imports at once) would stretch its steps after the baseline.
REAL_TRAINING = ("tests/e2e/test_straggler_sensitivity.py", "tests/e2e/test_training_jobs.py")


def _cost_class(item: pytest.Item) -> int:
    if item.nodeid.split("::", 1)[0] in REAL_TRAINING:
        return 0
    if item.get_closest_marker("e2e"):
        return 1
    if item.get_closest_marker("slow"):
        return 2
    return 3


# The end-to-end runs (minutes, mostly waiting on Prometheus evaluations and simulated time) set the suite's
# length, and some of them time real training steps. In parallel workers, the short modules run at a lower
# CPU priority: they take the cores the end-to-end runs leave idle and do not stretch a rank's step. Each test
# sets its worker's priority for its class: a worker whose first-round look-ahead was a short module goes on to
# a long unit, where at the filler's priority its in-process parts (a simulator's loop, a test daemon's thread)
# fall behind the training runs: the likely cause of a stray hang verdict (r4) and of a rank's lost pushes (r11).
# Raising it back takes root, as CI runs; elsewhere the worker stays at the filler's priority.
FILLER_NICENESS = 10
WORKER_NICENESS = os.nice(0)  # this process's priority when it started, before any filler


def daemon_priority() -> None:
    """In a daemon under test, between fork and exec: back to the worker's own priority where the system lets it
    (root, as CI runs). A worker that ran a short module before (every worker after its first long unit) is at
    the filler's, and its daemons inherit it: at +10 beside the nice-0 training runs, tests/reliability/test_floods'
    daemon got about 1% of a core and answered scrapes in 12 s and 17 s, against Prometheus's 10 s timeout."""
    if os.nice(0) != WORKER_NICENESS:
        with contextlib.suppress(OSError):  # not allowed: it stays where the worker is
            os.setpriority(os.PRIO_PROCESS, 0, WORKER_NICENESS)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    wanted = FILLER_NICENESS if _cost_class(item) == 3 else WORKER_NICENESS
    if os.nice(0) != wanted:
        with contextlib.suppress(OSError):  # raising it back needs root: without, it stays lower
            os.setpriority(os.PRIO_PROCESS, 0, wanted)
