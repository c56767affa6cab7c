"""The two tiers scripts/test runs side by side: the gate (-m "not live") and the live tier (-m live)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def _collect(directory: Path, marks: str) -> subprocess.CompletedProcess[str]:
    """This suite's collection hooks (tests/conftest.py as a plugin) over ``directory``'s modules."""
    # Without the plugins the suite's other modules use (each loads a few seconds of imports)
    unused = ("cacheprovider", "xdist", "hypothesispytest", "schemathesis", "anyio", "cloudcoil")
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tests.conftest",
                           *(f"-pno:{name}" for name in unused), "-m", marks, str(directory)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)


def test_the_live_tier_imports_only_modules_that_say_they_are_live(tmp_path: Path) -> None:
    (tmp_path / "test_live_one.py").write_text("import pytest\n\n\n@pytest.mark.live\ndef test_run():\n    pass\n")
    (tmp_path / "test_gate_one.py").write_text("raise SystemExit('imported by the live tier')\n")
    result = _collect(tmp_path, "live")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_live_one.py::test_run" in result.stdout and "imported" not in result.stdout + result.stderr


def test_a_live_test_in_a_module_that_does_not_say_so_stops_the_gate(tmp_path: Path) -> None:
    """Marked another way, the live tier would never read it and the gate would leave it out: it ran nowhere."""
    (tmp_path / "test_hidden.py").write_text("from pytest import mark\n\n\n@mark.live\ndef test_run():\n    pass\n")
    result = _collect(tmp_path, "not live")
    assert result.returncode != 0
    assert "test_hidden.py" in result.stdout + result.stderr and "pytest.mark.live" in result.stdout + result.stderr
