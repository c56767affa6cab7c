"""Tests of the Grafana dashboards (exporter/fleetscope/dashboards/, dashboards/)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require_module(name: str) -> ModuleType:
    """Import a test dependency; in CI a missing one fails instead of skipping (pip install -e '.[test]')."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required in CI but not installed", pytrace=False)
        pytest.skip(f"{name} not installed", allow_module_level=True)
        raise
