"""Loading the committed rule files for the rule tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS_DIR = REPO / "alerts"
TESTS_DIR = Path(__file__).resolve().parent
PLAIN_FILES = ("fleetscope.rules.yml", "fleetscope.e2e.rules.yml")
PROMETHEUSRULE_FILE = "fleetscope.prometheusrule.yaml"
# The optional dcgm-exporter compatibility group (exporter/fleetscope/rules/dcgm.py), deployed only on request.
DCGM_FILE = "fleetscope.dcgm.rules.yml"


def load_groups(name: str) -> list[dict[str, Any]]:
    document = yaml.safe_load((ALERTS_DIR / name).read_text(encoding="utf-8"))
    if document.get("kind") == "PrometheusRule":
        document = document["spec"]
    return document["groups"]


def iter_rules(groups: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for group in groups:
        yield from group["rules"]


def group_order(name: str = "fleetscope.rules.yml") -> list[str]:
    """The file's group names in order, for a promtool test's ``group_eval_order``: without it promtool evaluates
    the groups in no fixed order, and a record read by another group is an evaluation late in some runs only."""
    return [group["name"] for group in load_groups(name)]
