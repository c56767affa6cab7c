"""Recording rules follow Prometheus's naming and the one vocabulary of fleetscope.promql.

That rules reference only defined metrics and recorded rules is checked, together with the dashboards,
in tests/metrics/test_references.py.
"""

from __future__ import annotations

from .rulefiles import PLAIN_FILES, iter_rules, load_groups


def test_recording_rule_names_follow_level_metric_operations() -> None:
    for name in PLAIN_FILES:
        for rule in iter_rules(load_groups(name)):
            if "record" in rule:
                level, metric, operations = rule["record"].split(":")
                assert level and operations and metric.startswith("fleetscope_"), rule["record"]


def test_recorded_names_are_the_signals_vocabulary() -> None:
    """Rules record only names of fleetscope.promql, the vocabulary the dashboards read too."""
    from fleetscope.promql import recording_rule_names

    vocabulary = recording_rule_names()
    for name in PLAIN_FILES:
        defined = {rule["record"] for rule in iter_rules(load_groups(name)) if "record" in rule}
        assert sorted(defined - vocabulary) == [], f"{name}: add these names to fleetscope/promql.py"
