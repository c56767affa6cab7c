"""Rules an SRE can read and a managed ruler accepts: short expressions, groups within Mimir's default rules per
group, the whole set within AMP's default rules per workspace."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from fleetscope.promql import recording_rule_names
from fleetscope.rules.render import build_groups, render
from fleetscope.rules.settings import PRODUCTION

from .rulefiles import PLAIN_FILES, iter_rules, load_groups

# A node-mixin alert reads in about 7 lines; past 15 an expression wants a recording rule of its own.
MAX_EXPRESSION_LINES = 15
# Grafana Mimir's ruler_max_rules_per_rule_group default.
MIMIR_RULES_PER_GROUP = 20
# Amazon Managed Service for Prometheus, "Rules per workspace" default (docs/deploy.md cites it). The shipped
# set is loaded once per cluster shard, so it must leave room for several.
AMP_RULES_PER_WORKSPACE = 2000
SHARDS_PER_WORKSPACE = 8


@pytest.mark.parametrize("name", PLAIN_FILES)
def test_no_expression_is_longer_than_fifteen_lines(name: str) -> None:
    long = {
        (rule.get("alert") or rule["record"]): len(rule["expr"].splitlines())
        for rule in iter_rules(load_groups(name))
        if len(rule["expr"].splitlines()) > MAX_EXPRESSION_LINES
    }
    assert long == {}


@pytest.mark.parametrize("name", PLAIN_FILES)
def test_every_group_fits_mimir_default_rules_per_group(name: str) -> None:
    sizes = {group["name"]: len(group["rules"]) for group in load_groups(name)}
    assert max(sizes.values()) <= MIMIR_RULES_PER_GROUP, sizes


def test_several_cluster_shards_fit_amp_default_rules_per_workspace() -> None:
    rules = sum(len(group.rules) for group in build_groups(PRODUCTION))
    assert rules * SHARDS_PER_WORKSPACE <= AMP_RULES_PER_WORKSPACE, rules


def test_the_checks_would_catch_a_long_expression_and_a_big_group() -> None:
    group = {"name": "g", "rules": [{"record": "a:b:c", "expr": "x\n" * 16}] * 21}
    assert len(group["rules"][0]["expr"].splitlines()) > MAX_EXPRESSION_LINES
    assert len(group["rules"]) > MIMIR_RULES_PER_GROUP


def test_a_cluster_shard_reads_only_its_own_records() -> None:
    """Shards loaded into one workspace see each other's records: every record a shard reads carries its cluster,
    and every record keeps `cluster` (else the shard's own reads would find nothing)."""
    settings = dataclasses.replace(PRODUCTION, selector='job="fleetscope", cluster="east"')
    reads = re.compile(rf"(?<![\w:])({'|'.join(map(re.escape, recording_rule_names()))})(?![\w:])(\{{[^}}]*\}})?")
    seen = 0
    for rule in iter_rules(yaml.safe_load(render(settings))["groups"]):
        for text in (rule["expr"], *rule.get("annotations", {}).values()):
            for read in reads.finditer(text):
                seen += 1
                assert (read.group(2) or "").startswith('{cluster="east"'), (rule.get("alert") or rule["record"], read)
    assert seen > 100
    unsharded = render(PRODUCTION)
    assert 'cluster="east"' not in unsharded and "cluster=" not in unsharded


def test_every_record_keeps_cluster() -> None:
    """An aggregation that drops `cluster` would make a shard's own records invisible to it."""
    by_clause = re.compile(r"\b(?:by|without) \(([^)]*)\)")
    for rule in iter_rules(load_groups("fleetscope.rules.yml")):
        if "record" not in rule:
            continue
        for labels in by_clause.findall(rule["expr"]):
            kept = {label.strip() for label in labels.split(",")}
            assert "cluster" in kept or "without" in rule["expr"], (rule["record"], labels)
