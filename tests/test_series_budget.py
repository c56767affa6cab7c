"""The series budget (#15): a p5 node at the default detail level stays within fleetscope.metrics.budget.BUDGET,
every metric a rule or dashboard reads is exported there, and no stored series carries more than 15 labels.

The node is the simulator's p5.48xlarge (benchmarks/fleet.py, which copies it into a fleet) read by the real
collectors through the real daemon, with 8 ranks pushing steps; one scrape per level.
"""

from __future__ import annotations

import glob
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.fleet import scrape_p5_node
from fleetscope.metrics import ALL_TABLES, BY_NAME, MetricSpec, budget
from fleetscope.metrics.spec import DetailLevel
from tests.conftest import ROOT

REPO = Path(ROOT)
MAX_LABELS = 15
# Labels a daemon's series get from the scrape besides its own: what every scrape config adds.
SCRAPE_LABELS = {"job", "instance"}
METRIC_NAME = re.compile(r"(?<![\w:])fleetscope_[a-z0-9_]+\b(?!:)")
SELECTOR = re.compile(r"(?<![\w:])(fleetscope_[a-z0-9_]+)\{([^{}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def owner(name: str) -> str:
    for table in ALL_TABLES:
        if any(spec.name == name for spec in table):
            return "engine" if table.collector == "engine" else table.collector
    raise KeyError(name)


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory) -> dict[DetailLevel, str]:
    return {level: scrape_p5_node(tmp_path_factory.mktemp(f"p5-{level}"), level) for level in ("default", "all")}


def samples(text: str) -> Iterator[tuple[str, dict[str, str]]]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels


def series_per_collector(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, _ in samples(text):
        counts[owner(name)] = counts.get(owner(name), 0) + 1
    return counts


# -- the budget ---------------------------------------------------------------------------------------


def test_default_level_fits_the_budget(scrapes: dict[DetailLevel, str]) -> None:
    total = sum(series_per_collector(scrapes["default"]).values()) + budget.PROMETHEUS_PER_TARGET
    assert total <= budget.BUDGET
    everything = sum(series_per_collector(scrapes["all"]).values()) + budget.PROMETHEUS_PER_TARGET
    assert everything > 2 * budget.BUDGET  # what the levels are for: every device, port and link


@pytest.mark.parametrize("level", ["default", "all"])
def test_documented_series_counts_are_the_counted_ones(scrapes: dict[DetailLevel, str], level: DetailLevel) -> None:
    documented = {collector: counts[level] for collector, counts in budget.P5_SERIES.items()}
    assert series_per_collector(scrapes[level]) == documented, (
        "the p5 series counts changed: update fleetscope/metrics/budget.py and run `fleetscope catalog`")
    assert budget.p5_total(level) == sum(documented.values()) + budget.PROMETHEUS_PER_TARGET


def test_default_level_keeps_every_label_a_rule_or_dashboard_selects_on(scrapes: dict[DetailLevel, str]) -> None:
    exported = dict(samples(scrapes["default"]))
    for name, matchers in used_selectors():
        spec = BY_NAME[name]
        kept = spec.labels_at("default")
        assert kept is not None, f"{name} is used by a rule or dashboard but not exported at the default level"
        missing = set(matchers) - set(kept) - set(spec.info_keys) - SCRAPE_LABELS - {"cluster"}
        assert not missing, f"{name}{{{matchers}}}: no {sorted(missing)} at the default level"
        if name in exported:
            assert set(kept) <= set(exported[name]) | set(spec.info_keys)


# -- every metric the rules and dashboards read ---------------------------------------------------------


def rule_and_dashboard_texts() -> list[str]:
    paths = [REPO / "alerts" / "fleetscope.rules.yml", *sorted((REPO / "dashboards").glob("*.json"))]
    return [path.read_text(encoding="utf-8") for path in paths]


def used_names() -> set[str]:
    return {name for text in rule_and_dashboard_texts() for name in METRIC_NAME.findall(text)}


def used_selectors() -> Iterator[tuple[str, list[str]]]:
    for text in rule_and_dashboard_texts():
        for expr in _expressions(text):
            for name, body in SELECTOR.findall(expr):
                yield name, MATCHER_LABEL.findall(body)


def _expressions(text: str) -> Iterator[str]:
    """PromQL of rule expressions, annotation templates and dashboard targets, JSON/YAML escapes undone."""
    try:
        document: Any = json.loads(text)
    except ValueError:
        document = yaml.safe_load(text)
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and "fleetscope_" in item:
            yield item


def test_every_metric_rules_and_dashboards_use_is_exported_at_the_default_level(
    scrapes: dict[DetailLevel, str],
) -> None:
    used = used_names()
    assert len(used) > 50, "no metric names found: the extractor is broken"
    default = {name for name, _ in samples(scrapes["default"])}
    every = {name for name, _ in samples(scrapes["all"])}
    for name in sorted(used):
        spec = BY_NAME[name]
        assert spec.labels_at("default") is not None, f"{name}: used, but exported only at detail level all"
        if name in every:  # on this node at all: then at the default level too
            assert name in default, f"{name}: the p5 node exports it only at detail level all"
    # the p5 node shows the hardware and training metrics the rules read (Xids, NCCL, jobs need events)
    shown = used & every
    assert len(shown) > 0.7 * len(used & {s.name for t in ALL_TABLES if t.collector != "nccl" for s in t})


# -- labels per series ----------------------------------------------------------------------------------


def target_labels() -> dict[str, set[str]]:
    """Per shipped scrape configuration: the labels it gives every series (besides the daemon's own)."""
    out: dict[str, set[str]] = {}
    compose = str(REPO / "deploy" / "compose" / "prometheus.yml")
    for path in [*sorted(glob.glob(str(REPO / "deploy" / "prometheus" / "*.yml"))), compose]:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        external = set((config.get("global") or {}).get("external_labels") or {})
        for job in config.get("scrape_configs", []):
            if job["job_name"] != "fleetscope":
                continue
            labels = set(SCRAPE_LABELS) | external
            for relabel in job.get("relabel_configs", []):
                target = relabel.get("target_label", "")
                if relabel.get("action", "replace") == "replace" and target and not target.startswith("__"):
                    labels.add(target)
            for static in job.get("static_configs", []):
                labels |= set(static.get("labels", {}))
            out[f"{Path(path).name}"] = labels
    monitor = yaml.safe_load(
        (REPO / "deploy/kubernetes/components/prometheus-operator/servicemonitor.yaml").read_text(encoding="utf-8"))
    # What the Prometheus operator gives a ServiceMonitor's targets, then the monitor's own relabelings.
    labels = {"job", "instance", "namespace", "service", "pod", "container", "endpoint"}
    for endpoint in monitor["spec"]["endpoints"]:
        for relabel in endpoint.get("relabelings", []):
            if relabel.get("action") == "labeldrop":
                labels = {label for label in labels if not re.fullmatch(relabel["regex"], label)}
            elif relabel.get("targetLabel"):
                labels.add(relabel["targetLabel"])
    out["servicemonitor.yaml"] = labels
    return out


def test_shipped_scrape_configs_are_read() -> None:
    configs = target_labels()
    assert {"amp-agent.yml", "slurm-ec2.yml", "servicemonitor.yaml"} <= set(configs)
    assert "slurm_cluster" in configs["slurm-ec2.yml"] and "cluster" in configs["amp-agent.yml"]


def label_names(spec: MetricSpec) -> int:
    return len(spec.all_labels)


@pytest.mark.parametrize("config", sorted(target_labels()))
def test_no_series_carries_more_than_15_labels(config: str, scrapes: dict[DetailLevel, str]) -> None:
    scrape_labels = target_labels()[config]
    for table in ALL_TABLES:
        for spec in table:
            total = label_names(spec) + len(scrape_labels - set(spec.all_labels))
            assert total <= MAX_LABELS, f"{spec.name} scraped by {config}: {total} labels"
    for name, labels in samples(scrapes["all"]):
        assert len(set(labels) | scrape_labels) <= MAX_LABELS, (name, labels)
