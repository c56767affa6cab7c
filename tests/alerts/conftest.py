"""Fixtures for the rule tests."""

from __future__ import annotations

from typing import Any

import pytest

from .rulefiles import iter_rules, load_groups


@pytest.fixture(scope="session")
def production_rules() -> list[dict[str, Any]]:
    return list(iter_rules(load_groups("fleetscope.rules.yml")))


@pytest.fixture(scope="session")
def production_alerts(production_rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for rule in production_rules if "alert" in rule]
