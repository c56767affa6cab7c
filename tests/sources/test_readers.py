"""Readers parse raw data into typed readings and know no metric names."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import fleetscope.sources


def test_no_reader_imports_the_metric_contract_or_prometheus_client() -> None:
    modules = [f"fleetscope.sources.{m.name}" for m in pkgutil.iter_modules(fleetscope.sources.__path__)]
    assert len(modules) >= 9
    code = (
        f"import sys, importlib\nfor m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('fleetscope.metrics', 'fleetscope.collectors', "
        "'prometheus_client')))\nassert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
