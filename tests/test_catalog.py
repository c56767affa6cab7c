from __future__ import annotations

import os
import re

from fleetscope.catalog import all_tables, catalog_metrics, render_catalog

from tests.conftest import ROOT

CATALOG = os.path.join(ROOT, "docs", "metrics.md")


def test_committed_catalog_matches_the_code():
    with open(CATALOG, encoding="utf-8") as handle:
        committed = handle.read()
    assert committed == render_catalog(), "docs/metrics.md is out of date: run `fleetscope catalog`"


def test_every_metric_follows_the_naming_rules():
    for name, spec in catalog_metrics().items():
        assert re.fullmatch(r"fleetscope_[a-z0-9_]+", name), name
        assert spec.help.strip(), f"{name} has no help"
        if spec.kind == "counter":
            assert name.endswith("_total"), name
        if spec.unit == "seconds":
            assert "_seconds" in name, name
        if spec.unit == "bytes":
            assert "_bytes" in name, name
        assert "job" not in spec.all_labels, f"{name}: use training_job, `job` is Prometheus's target label"


def test_every_registered_collector_declares_tables():
    collectors = {name for name, _ in all_tables()}
    assert {"engine", "efa", "netdev", "netstat", "ena", "gpu", "steps"} <= collectors
