"""fleetscope.client must work in a training image without the daemon's dependencies."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = (
    "fastapi",
    "pydantic",
    "pydantic_core",
    "prometheus_client",
    "starlette",
    "uvicorn",
    "yaml",
    "requests",
    "torch",
    "httpx",
)

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = set(sys.argv[1].split(","))

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    from fleetscope.client import StepTracker
    tracker = StepTracker(
        job="t", rank=0, url="http://127.0.0.1:9", environ={}, cuda_events=True, timeout=0.2
    )
    with tracker.step():
        with tracker.phase("compute"):
            tracker.add("comm", 0.001)
    for _ in tracker.steps(tracker.loader([1, 2])):
        pass
    tracker.now_in("data")
    tracker.report(0.5)
    tracker.close(timeout=1)
    loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
    assert not loaded, loaded
    assert tracker.stats().enqueued == 4, tracker.stats()
    print("ok")
    """
)


def test_client_imports_and_runs_with_daemon_dependencies_blocked() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(BLOCKED)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_blocking_works() -> None:
    """The harness itself: importing a blocked module must fail, or the test above proves nothing."""
    probe = SCRIPT.split("from fleetscope.client")[0] + "import pydantic\n"
    result = subprocess.run(
        [sys.executable, "-c", probe, "pydantic"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0 and "blocked" in result.stderr
