"""The node conditions and the findings that may mark a node: consistent with the rules they read."""

from __future__ import annotations

import pytest
import yaml

from fleetscope.check.verdicts import CONDITIONS, FINDINGS, NODE_CAUSES, allowed_nodes, breaker_tripped
from fleetscope.config import ConfigError, load
from fleetscope.promql import STRAGGLER_CAUSES
from tests.conftest import ROOT


def production_alerts() -> dict[str, dict]:
    with open(f"{ROOT}/alerts/fleetscope.rules.yml", encoding="utf-8") as handle:
        groups = yaml.safe_load(handle)["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def test_every_finding_is_a_fleetscope_alert_naming_a_node() -> None:
    alerts = production_alerts()
    for finding in FINDINGS:
        assert finding.alert in alerts, finding.alert
        assert "$labels.instance" in alerts[finding.alert]["annotations"]["description"], finding.alert


def test_only_causes_on_the_node_count() -> None:
    assert set(NODE_CAUSES) < set(STRAGGLER_CAUSES)
    assert not {"input_wait", "host_cpu", "unknown"} & set(NODE_CAUSES), "the job's causes never mark a node"


def test_conditions_name_their_problem() -> None:
    # node-problem-detector sets a condition True while its plugin exits 1: the type names the problem.
    assert [c.type for c in CONDITIONS.values()] == [
        "FleetscopeGPUProblem", "FleetscopeEFAProblem", "FleetscopeTrainingPerformanceProblem"]
    assert [c.name for c in CONDITIONS.values() if c.cross_node] == ["training"]


@pytest.mark.parametrize("nodes, percent, allowed", [
    (10, 20, 2), (11, 20, 3), (4, 20, 1), (1, 20, 1), (2048, 20, 410), (100, 20, 20), (3, 50, 2), (0, 20, 1),
])
def test_allowed_nodes_round_up_and_keep_one(nodes: int, percent: float, allowed: int) -> None:
    assert allowed_nodes(nodes, percent) == allowed
    assert not breaker_tripped(allowed, nodes, percent)
    assert breaker_tripped(allowed + 1, nodes, percent)


def test_check_settings() -> None:
    config = load({"check.prometheus-url": "http://prometheus:9090/", "check.breaker-percent": "25%",
                   "check.selector": 'job="fleetscope", cluster=~"p5-.*"'}, environ={})
    assert config.check.prometheus_url == "http://prometheus:9090"
    assert config.check.breaker_percent == 25
    assert config.check.breaker_window == 600 and config.check.prometheus_timeout == 2
    for key, value in (("check.prometheus-url", "prometheus:9090"), ("check.prometheus-url", "http://p/?x=1"),
                       ("check.breaker-percent", "0"), ("check.breaker-percent", "120"),
                       ("check.selector", "job=fleetscope"), ("check.selector", 'job="a"}, up{x="y"')):
        with pytest.raises(ConfigError, match=f"--{key}"):
            load({key: value}, environ={})
