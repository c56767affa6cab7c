"""Rules use only catalog metrics, or recording rules defined in the rule files.

The catalog is docs/metrics.md (generated from the metric tables). Until that
file exists, the binding names of docs/design.md stand in for it.
"""

from __future__ import annotations

import itertools
import re

import pytest

from .rulefiles import PLAIN_FILES, REPO, iter_rules, load_groups

RECORDING_NAME = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")
METRIC_NAME = re.compile(r"(?<![\w:])fleetscope_[a-z0-9_]+\b(?!:)")
CATALOG_ROW = re.compile(r"^\|\s*`(fleetscope_[a-z0-9_]+)`\s*\|", re.MULTILINE)
DESIGN_TOKEN = re.compile(r"`(fleetscope_[^`]*)`")
# Series Prometheus itself adds to every target.
PROMETHEUS_SERIES = {"up"}


def expand_braces(token: str) -> list[str]:
    """``fleetscope_efa_{tx,rx}_bytes_total{device,port}`` -> the two names, without the label list."""
    token = re.sub(r"\{[^{}]*\}$", "", token.strip())  # a trailing {...} lists labels
    parts = re.split(r"\{([^{}]*)\}", token)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def design_names(text: str) -> set[str]:
    return {name for token in DESIGN_TOKEN.findall(text) for name in expand_braces(token)}


def catalog_names() -> tuple[set[str], str]:
    catalog = REPO / "docs" / "metrics.md"
    if catalog.exists():
        return set(CATALOG_ROW.findall(catalog.read_text(encoding="utf-8"))), "docs/metrics.md"
    return design_names((REPO / "docs" / "design.md").read_text(encoding="utf-8")), "docs/design.md"


def used_names(texts: list[str]) -> tuple[set[str], set[str]]:
    """(recording rule names, raw metric names) appearing in PromQL or templates."""
    recorded, raw = set(), set()
    for text in texts:
        recorded |= set(RECORDING_NAME.findall(text))
        raw |= set(METRIC_NAME.findall(RECORDING_NAME.sub(" ", text)))
    return recorded, raw


def test_brace_expansion_reads_design_tokens() -> None:
    assert expand_braces("fleetscope_efa_rdma_read_{work_requests,bytes}_total") == [
        "fleetscope_efa_rdma_read_work_requests_total", "fleetscope_efa_rdma_read_bytes_total"]
    assert expand_braces("fleetscope_gpu_clock_hertz{gpu,uuid,clock}") == ["fleetscope_gpu_clock_hertz"]
    assert expand_braces("fleetscope_net_{receive,transmit}_{bytes,packets}_total")[3] == (
        "fleetscope_net_transmit_packets_total")


def test_extraction_separates_recording_rules_from_metrics() -> None:
    recorded, raw = used_names(["rate(fleetscope_a_total[5m]) / on (x) instance:fleetscope_b:rate5m"])
    assert recorded == {"instance:fleetscope_b:rate5m"}
    assert raw == {"fleetscope_a_total"}


@pytest.mark.parametrize("name", PLAIN_FILES)
def test_rules_use_only_catalog_metrics(name: str) -> None:
    catalog, source = catalog_names()
    assert len(catalog) > 100, f"could not read metric names from {source}"
    rules = list(iter_rules(load_groups(name)))
    defined = {rule["record"] for rule in rules if "record" in rule}
    texts = [rule["expr"] for rule in rules] + [v for rule in rules for v in rule.get("annotations", {}).values()]
    recorded, raw = used_names(texts)
    assert raw, "no metric names found: the extractor is broken"
    assert sorted(raw - catalog - PROMETHEUS_SERIES) == [], f"metrics not in {source}"
    assert sorted(recorded - defined) == [], "recording rules used but not defined"


def test_recording_rule_names_follow_level_metric_operations() -> None:
    for name in PLAIN_FILES:
        for rule in iter_rules(load_groups(name)):
            if "record" in rule:
                level, metric, operations = rule["record"].split(":")
                assert level and operations and metric.startswith("fleetscope_"), rule["record"]


def test_recorded_names_are_the_signals_vocabulary() -> None:
    """Rules record only names of fleetscope.signals, the vocabulary the dashboards read too."""
    from fleetscope.signals import recording_rule_names

    vocabulary = recording_rule_names()
    for name in PLAIN_FILES:
        defined = {rule["record"] for rule in iter_rules(load_groups(name)) if "record" in rule}
        assert sorted(defined - vocabulary) == [], f"{name}: add these names to fleetscope/signals.py"
