"""Loading the committed rule files for the rule tests."""

from __future__ import annotations

import re
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


def produced_names(group: dict[str, Any]) -> set[str]:
    """The series a group writes: its records, and ALERTS under each alert's name."""
    return {rule.get("record") or rule["alert"] for rule in group["rules"]}


def mentions(text: str, name: str) -> bool:
    """Whether ``name`` occurs in ``text`` as a whole name (a record's colons and underscores are part of it)."""
    return re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", text) is not None


def strings(node: Any) -> str:
    """Every string in a loaded YAML document, one a line (as written, unlike a dump, which escapes and folds)."""
    if isinstance(node, dict):
        return "\n".join(strings(value) for value in node.values())
    if isinstance(node, list):
        return "\n".join(strings(value) for value in node)
    return str(node)


def needed_groups(groups: list[dict[str, Any]], test_text: str, always: set[str]) -> list[dict[str, Any]]:
    """The groups a promtool unit test can observe, in file order: those named in ``always`` or writing a record or
    alert the test's text names, and then every group writing a name that a kept group's text (expressions and
    annotation queries, ``ALERTS{alertname=...}`` included) names, until nothing is added. Leaving out the rest
    changes no value the test reads: a series is written only by the group that records it. The names are matched as
    text, so a mention in a comment or an annotation keeps a group too: the set errs only toward too many."""
    kept = {group["name"] for group in groups if group["name"] in always
            or any(mentions(test_text, name) for name in produced_names(group))}
    while True:
        text = "\n".join(strings(group) for group in groups if group["name"] in kept)
        more = {group["name"] for group in groups if group["name"] not in kept
                and any(mentions(text, name) for name in produced_names(group))}
        if not more:
            return [group for group in groups if group["name"] in kept]
        kept |= more


def promtool_test_on_needed_groups(test_file: Path, out_dir: Path) -> Path:
    """A copy of the promtool unit-test file ``test_file`` in ``out_dir`` whose rule files hold only the groups of
    the committed rule files that its tests can observe (``needed_groups``), each group as committed. promtool
    evaluates every loaded group at every evaluation step, so a test of one group over a week of ten-minute steps
    otherwise pays for all 30 groups at each of them."""
    text = test_file.read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    always = set(document.get("group_eval_order") or [])
    rule_files = []
    for index, name in enumerate(document["rule_files"]):
        source = yaml.safe_load((test_file.parent / name).read_text(encoding="utf-8"))
        subset = out_dir / f"{index}-{Path(name).name}"
        subset.write_text(yaml.safe_dump({"groups": needed_groups(source["groups"], text, always)}), encoding="utf-8")
        rule_files.append(str(subset))
    document["rule_files"] = rule_files
    copy = out_dir / test_file.name
    copy.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return copy
