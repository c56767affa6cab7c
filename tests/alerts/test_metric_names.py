"""Recording rules follow Prometheus's naming and the one vocabulary of fleetscope.promql.

That rules reference only defined metrics and recorded rules is checked, together with the dashboards,
in tests/metrics/test_references.py.
"""

from __future__ import annotations

import re

from .rulefiles import DCGM_FILE, PLAIN_FILES, iter_rules, load_groups


def test_recording_rule_names_follow_level_metric_operations() -> None:
    for name in PLAIN_FILES:
        for rule in iter_rules(load_groups(name)):
            if "record" in rule:
                level, metric, operations = rule["record"].split(":")
                assert level and operations and metric.startswith("fleetscope_"), rule["record"]


def test_dcgm_compat_file_records_only_dcgm_names() -> None:
    """The one exemption from level:metric:operations, for DCGM_FILE only.

    That file exists to record dcgm-exporter's own names (DCGM_FI_*, no colon) so a dashboard built for
    dcgm-exporter works unchanged; it is a separate, opt-in file, never part of the production rules, and
    it records nothing else.
    """
    assert DCGM_FILE not in PLAIN_FILES
    records = [rule["record"] for rule in iter_rules(load_groups(DCGM_FILE))]
    assert all("record" in rule for rule in iter_rules(load_groups(DCGM_FILE))), "no alerts in the DCGM file"
    assert records and all(re.fullmatch(r"DCGM_FI_(DEV|PROF)_[A-Z0-9_]+", name) for name in records), records
    assert len(set(records)) == len(records)


def test_recorded_names_are_the_signals_vocabulary() -> None:
    """Rules record only names of fleetscope.promql, the vocabulary the dashboards read too."""
    from fleetscope.promql import recording_rule_names

    vocabulary = recording_rule_names()
    for name in PLAIN_FILES:
        defined = {rule["record"] for rule in iter_rules(load_groups(name)) if "record" in rule}
        assert sorted(defined - vocabulary) == [], f"{name}: add these names to fleetscope/promql.py"
