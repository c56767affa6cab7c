"""Render the rule groups as a Prometheus rule file or a Kubernetes PrometheusRule."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

from fleetscope.promql import recording_rule_names
from fleetscope.rules import causes, dcgm, goodput, gpu, nccl, network, offenders, progress, selfmon, training
from fleetscope.rules.model import Alert, Group, Record, Rule
from fleetscope.rules.settings import PRESETS, PRODUCTION, Settings, values_of

Format = Literal["rules", "prometheusrule", "helm-values"]
FORMATS: tuple[Format, ...] = ("rules", "prometheusrule", "helm-values")



def build_groups(settings: Settings) -> list[Group]:
    """Recording groups first (readers see the aggregates before the alerts using them)."""
    built: list[Group | list[Group]] = [
        training.recording_rules(settings),
        training.pace_rules(settings),
        progress.recording_rules(settings),
        gpu.recording_rules(settings),
        network.recording_rules(settings),
        nccl.recording_rules(settings),
        causes.recording_rules(settings),
        goodput.recording_rules(settings),
        training.alert_rules(settings),
        training.pace_alert_rules(settings),
        progress.alert_rules(settings),
        gpu.alert_rules(settings),
        gpu.degradation_rules(settings),
        network.alert_rules(settings),
        nccl.alert_rules(settings),
        selfmon.alert_rules(settings),
        offenders.rules(settings),
    ]
    return [group for entry in built for group in (entry if isinstance(entry, list) else [entry])]


# The committed files under alerts/: name -> (preset, format, groups). The dcgm-exporter compatibility
# group is a file of its own, deployed only on request (docs/dcgm.md); its dotted name keeps
# deploy/kubernetes/generate.py from shipping it with the production rules.
OUTPUTS: dict[str, tuple[str, Format, Callable[[Settings], list[Group]]]] = {
    "fleetscope.rules.yml": ("production", "rules", build_groups),
    "fleetscope.prometheusrule.yaml": ("production", "prometheusrule", build_groups),
    "fleetscope.e2e.rules.yml": ("e2e", "rules", build_groups),
    "fleetscope.dcgm.rules.yml": ("production", "rules", dcgm.groups),
}


def runbook_anchor(alert_name: str) -> str:
    """GitHub's anchor for a ``## AlertName`` heading."""
    return alert_name.lower()


# The `cluster` matcher of a selector (`cluster="east"`, `cluster=~"east|west"`).
CLUSTER_MATCHER = re.compile(r'\bcluster\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')


@cache
def _record_reads() -> re.Pattern[str]:
    """A recording-rule name as read in an expression or a template query, with its matchers if any."""
    names = "|".join(re.escape(name) for name in sorted(recording_rule_names(), key=len, reverse=True))
    return re.compile(rf"(?<![\w:])({names})(?![\w:])(\{{[^}}]*\}})?")


def shard(text: str, selector: str) -> str:
    """``text`` with the selector's ``cluster`` matcher on every record it reads.

    Shards of one rule set loaded into one workspace (AMP, Mimir) see each other's records; raw series are
    read through the selector already, records by name. A selector without ``cluster`` leaves ``text`` as is.
    """
    found = CLUSTER_MATCHER.search(selector)
    if not found:
        return text
    matcher = found.group(0)

    def scoped(read: re.Match[str]) -> str:
        name, labels = read.group(1), read.group(2)
        inner = labels[1:-1].strip() if labels else ""
        return f"{name}{{{matcher}{', ' + inner if inner else ''}}}"

    return _record_reads().sub(scoped, text)


def rule_dict(rule: Rule, settings: Settings) -> dict[str, Any]:
    out = _rule_dict(rule, settings)
    out["expr"] = shard(out["expr"], settings.selector)
    if "annotations" in out:
        out["annotations"] = {key: shard(value, settings.selector) for key, value in out["annotations"].items()}
    return out


def _rule_dict(rule: Rule, settings: Settings) -> dict[str, Any]:
    if isinstance(rule, Record):
        out: dict[str, Any] = {"record": rule.record, "expr": rule.expr}
        if rule.labels:
            out["labels"] = dict(rule.labels)
        return out
    assert isinstance(rule, Alert)
    out = {"alert": rule.alert, "expr": rule.expr}
    if rule.for_:
        out["for"] = rule.for_
    if settings.keep_firing_for:
        out["keep_firing_for"] = settings.keep_firing_for
    out["labels"] = {"severity": rule.severity, **rule.labels}
    out["annotations"] = {
        "summary": rule.summary,
        "description": rule.description,
        "runbook_url": f"{settings.runbook_base_url}#{runbook_anchor(rule.alert)}",
    }
    return out


def groups_dict(settings: Settings, build: Callable[[Settings], list[Group]] = build_groups) -> list[dict[str, Any]]:
    out = []
    for group in build(settings):
        entry: dict[str, Any] = {"name": group.name}
        interval = group.interval or settings.evaluation_interval
        if interval:
            entry["interval"] = interval
        entry["rules"] = [rule_dict(rule, settings) for rule in group.rules]
        out.append(entry)
    return out


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as ``|`` blocks, so the files read like hand-written rules."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def render(settings: Settings, fmt: Format = "rules", preset_name: str = "custom",
           build: Callable[[Settings], list[Group]] = build_groups) -> str:
    """The rule groups as a rule file, a PrometheusRule, or a values file for the Helm chart.

    ``helm-values`` is ``prometheusRule.groups`` (what the chart's PrometheusRule carries instead of the shipped
    rules) and ``prometheusRule.settings`` (the settings that differ from production, a record of the tuning).
    """
    header = (
        f"# Generated by `fleetscope rules` (exporter/fleetscope/rules/, preset {preset_name}); do not edit.\n"
        "# Regenerate with: python3 alerts/generate.py\n"
    )
    document: dict[str, Any] = {"groups": groups_dict(settings, build)}
    if fmt == "helm-values":
        header = (
            f"# Generated by `fleetscope rules --format helm-values` ({preset_name}); do not edit.\n"
            "# Pass it to the chart (helm upgrade --install ... -f FILE); regenerate it when the settings change.\n"
        )
        document = {"prometheusRule": {"settings": values_of(settings, PRODUCTION), **document}}
    if fmt == "prometheusrule":
        document = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": "fleetscope",
                "labels": {"app.kubernetes.io/name": "fleetscope", "app.kubernetes.io/component": "rules"},
            },
            "spec": document,
        }
    # A huge width: never fold a long description in the middle of a {{ template }} action.
    body = yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=1_000_000, allow_unicode=True)
    return header + body


# Rules per workspace in Amazon Managed Service for Prometheus by default (its quotas page, adjustable).
AMP_RULES_PER_WORKSPACE = 2000
# Marked spans of the docs that state the rule set's size (`<!-- name -->...<!-- /name -->`), rewritten
# from the production rules by alerts/generate.py, so no count in the docs goes stale.
_MARKED = re.compile(r"<!-- (?P<name>[a-z-]+) -->(?P<body>.*?)<!-- /(?P=name) -->", re.DOTALL)


def doc_counts(settings: Settings = PRODUCTION) -> dict[str, str]:
    """The text of each marked span: the rule set's size, and how many cluster shards fit one AMP workspace."""
    groups = build_groups(settings)
    rules = [rule for group in groups for rule in group.rules]
    alerts = sum(isinstance(rule, Alert) for rule in rules)
    return {
        "rule-counts": (f"The set is {len(rules)} rules ({alerts} alerts, {len(rules) - alerts} recording rules) "
                        f"in {len(groups)} groups."),
        "rule-shards": f"fits {AMP_RULES_PER_WORKSPACE // len(rules)} clusters",
    }


def with_doc_counts(text: str, counts: dict[str, str]) -> str:
    """``text`` with every marked span it has rewritten from ``counts`` (spans of other names untouched)."""

    def fill(span: re.Match[str]) -> str:
        name = span.group("name")
        return f"<!-- {name} -->{counts[name]}<!-- /{name} -->" if name in counts else span.group(0)

    return _MARKED.sub(fill, text)


def expected_outputs() -> dict[str, str]:
    return {name: render(PRESETS[preset], fmt, preset, build) for name, (preset, fmt, build) in OUTPUTS.items()}


def write_all(directory: Path) -> list[Path]:
    written = []
    for name, text in expected_outputs().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_outputs(directory: Path) -> list[str]:
    """Names of committed files that differ from what the generator produces now."""
    stale = []
    for name, text in expected_outputs().items():
        path = directory / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale
