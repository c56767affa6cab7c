"""Shared loading of the committed rule files for the rule tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS_DIR = REPO / "alerts"
TESTS_DIR = Path(__file__).resolve().parent
PLAIN_FILES = ("fleetscope.rules.yml", "fleetscope.e2e.rules.yml")
PROMETHEUSRULE_FILE = "fleetscope.prometheusrule.yaml"


def load_groups(name: str) -> list[dict[str, Any]]:
    document = yaml.safe_load((ALERTS_DIR / name).read_text(encoding="utf-8"))
    if document.get("kind") == "PrometheusRule":
        document = document["spec"]
    return document["groups"]


def iter_rules(groups: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for group in groups:
        yield from group["rules"]


@pytest.fixture(scope="session")
def production_rules() -> list[dict[str, Any]]:
    return list(iter_rules(load_groups("fleetscope.rules.yml")))


@pytest.fixture(scope="session")
def production_alerts(production_rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for rule in production_rules if "alert" in rule]
