from __future__ import annotations

import os

from fleetscope.metrics import ALL_TABLES
from fleetscope.metrics.catalog import render_catalog
from tests.conftest import ROOT

CATALOG = os.path.join(ROOT, "docs", "metrics.md")


def test_committed_catalog_matches_the_code():
    with open(CATALOG, encoding="utf-8") as handle:
        committed = handle.read()
    assert committed == render_catalog(), "docs/metrics.md is out of date: run `fleetscope catalog`"


def test_one_section_per_table_naming_its_collector():
    text = render_catalog()
    for table in ALL_TABLES:
        assert f"\n## {table.source} (collector `{table.collector}`)\n" in text
