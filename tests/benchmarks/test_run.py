"""Smoke test: the whole suite runs in --quick mode and writes every section of the report.

No figure is asserted against a threshold (timings belong in the report, not
in tests); the test checks that each figure was actually measured.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, require_binary

SECTIONS = (
    "## Machine and versions",
    "## Headline",
    "## 1. Scrape cost beside node_exporter",
    "### Why the earlier figures differed by 3x",
    "### Scraped by a real Prometheus",
    "## 2. Idle cost and the number of scrapers",
    "## 3. What a scrape and a reading cost",
    "## 4. Daemon CPU and memory",
    "## 5. Push path",
    "### Push endpoint vs Pushgateway",
    "## 6. Series per node",
    "## 6b. Series per node with the NCCL Inspector",
    "## 7. Where the time goes",
    "## Kubernetes resources",
)


pytestmark = pytest.mark.slow  # the fixture runs the quick benchmark: a minute or more


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> str:
    require_binary("prometheus-node-exporter")
    require_binary("prometheus-pushgateway")
    require_binary("prometheus")
    out = tmp_path_factory.mktemp("bench") / "benchmarks.md"
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=480, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return out.read_text(encoding="utf-8")


def table_rows(text: str, heading: str, which: int = 0) -> list[list[str]]:
    """Rows (cells) of the ``which``-th table after ``heading``, header and rule excluded."""
    section = text.split(heading, 1)[1]
    tables: list[list[list[str]]] = []
    inside = False
    for line in section.splitlines():
        if line.startswith("|"):
            if not inside:
                tables.append([])
                inside = True
            tables[-1].append([cell.strip() for cell in line.strip("|").split("|")])
        else:
            inside = False
            if len(tables) > which:
                break
    return tables[which][2:]


def test_every_section_is_written(report: str) -> None:
    positions = [report.index(heading) for heading in SECTIONS]
    assert positions == sorted(positions)
    assert "--quick" in report  # a smoke-test report says so


def test_versions_name_every_component(report: str) -> None:
    line = next(x for x in report.splitlines() if x.startswith("* python "))
    for component in ("fleetscope", "prometheus_client", "fastapi", "uvicorn", "node_exporter", "pushgateway",
                      "prometheus"):
        match = re.search(rf"{component} (\S+)", line)
        assert match and match.group(1)[0].isdigit(), f"{component} version missing in {line!r}"


def test_every_target_is_measured(report: str) -> None:
    rows = table_rows(report, "## Headline")
    assert len(rows) == 10  # nine from #16, and the GPU collector per cycle on the H100 latency model (#25)
    for what, _goal, measured, verdict in rows:
        assert "n/a" not in measured and verdict != "not measured", what


def test_scrape_side_by_side_covers_the_three_exporters_with_ratios(report: str) -> None:
    rows = table_rows(report, "## 1. Scrape cost beside node_exporter")
    assert [row[2] for row in rows] == ["node_exporter", "fleetscope, network collectors",
                                        "fleetscope, every collector + pushes"]
    for row in rows:
        assert int(row[3]) > 0, f"no scrapes measured for {row[2]}"
        assert row[4].endswith(" ms") and row[7].endswith("%") and row[9].endswith("MiB")
    ratios = table_rows(report, "## 1. Scrape cost beside node_exporter", 1)
    assert [row[0] for row in ratios] == ["fleetscope, network collectors", "fleetscope, every collector + pushes"]
    for row in ratios:
        assert all(re.fullmatch(r"\d+\.\d\dx \(\d+\.\d\dx-\d+\.\d\dx\)", cell) for cell in row[1:5]), row
        assert row[5] == "0", f"scrape errors: {row}"
    headline = report.split("## Headline", 1)[1].split("|", 1)[0]
    assert re.search(r"CPU per scrape \d+\.\d\dx", headline)


def test_a_real_prometheus_scraped_both(report: str) -> None:
    rows = table_rows(report, "### Scraped by a real Prometheus")
    assert [row[0] for row in rows] == ["node_exporter", "fleetscope"]
    for row in rows:  # a smoke run on a busy machine may time a scrape out: some must have succeeded
        assert float(row[1]) > 0 and row[2].endswith(" ms") and float(row[6]) > 0, row


def test_idle_and_scraper_counts_are_measured(report: str) -> None:
    rows = table_rows(report, "## 2. Idle cost and the number of scrapers")
    labels = [row[0] for row in rows]
    assert labels[:2] == ["no scraper", "no scraper, pausing off"]
    assert any("two scrapers" in label for label in labels)
    for row in rows:
        assert row[2].endswith("%"), row
        assert (int(row[1]) == 0) == row[0].startswith("no scraper"), row


def test_scrape_and_reading_costs_are_broken_down(report: str) -> None:
    requests = table_rows(report, "## 3. What a scrape and a reading cost")
    assert requests[0][0].startswith("`/healthz`") and len(requests) == 4
    parts = [row[0] for row in table_rows(report, "## 3. What a scrape and a reading cost", 1)]
    assert "`efa` collection" in parts
    assert any(part.startswith("`efa` render, OpenMetrics") for part in parts)
    assert any(part.startswith("whole `/metrics` body") for part in parts)


def test_push_endpoint_side_by_side(report: str) -> None:
    push = table_rows(report, "### Push endpoint vs Pushgateway")
    assert {(row[0], row[1]) for row in push} >= {
        ("Pushgateway", "PUT per record"), ("fleetscope", "POST per record"), ("fleetscope", "PUT per record"),
    }
    assert any(row[1].startswith("POST batched") for row in push)
    for row in push:
        assert row[4] == "0", f"push errors in {row}"


def test_cpu_and_memory_for_every_variant(report: str) -> None:
    rows = table_rows(report, "## 4. Daemon CPU and memory")
    counts = {(row[1], row[2], row[4]) for row in rows}
    assert ("8", "32", "8") in counts  # the p5 node
    assert ("1", "32", "8") in counts and ("8", "4", "8") in counts  # GPU and EFA scaling
    assert ("8", "32", "1") in counts and ("8", "32", "64") in counts  # rank scaling
    assert ("8", "32", "0") in counts  # the idle baseline
    for row in rows:
        assert row[5].endswith("%") and row[6].endswith("MiB")
        pushed = int(row[8].replace(",", ""))
        assert pushed > 0 if row[4] != "0" else pushed == 0, f"records pushed for {row[0]}: {pushed}"


def test_collector_cycles_and_series_cover_every_collector(report: str) -> None:
    cycles = {row[0] for row in table_rows(report, "## 4. Daemon CPU and memory", 1)}
    series = {row[0] for row in table_rows(report, "## 6. Series per node")}
    for collector in ("efa", "netdev", "netstat", "ena", "gpu"):
        assert collector in cycles, f"no cycle times for {collector}"
        assert collector in series, f"no series for {collector}"
    assert "steps" in series and "unmapped" not in series


def test_kubernetes_resources_are_valid_quantities(report: str) -> None:
    block = report.split("## Kubernetes resources", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    resources = yaml.safe_load(block)["resources"]
    for kind in ("requests", "limits"):
        assert re.fullmatch(r"\d+m", resources[kind]["cpu"])
        assert re.fullmatch(r"\d+Mi", resources[kind]["memory"])
    assert int(resources["limits"]["memory"][:-2]) >= int(resources["requests"]["memory"][:-2])
    assert int(resources["limits"]["cpu"][:-1]) >= int(resources["requests"]["cpu"][:-1])


def test_profiles_are_reported(report: str) -> None:
    section = report.split("## 7. Where the time goes", 1)[1]
    for part in ("one EFA reading rendered", "one scrape:", "collector efa", "collector gpu"):
        assert f"**{part}" in section


def test_largest_bodies_are_accepted_and_their_memory_reported(report: str) -> None:
    line = next(x for x in report.splitlines() if x.startswith("Memory under the largest bodies"))
    match = re.search(r"bodies of ([\d,]+) records .*: ([\d,]+) records accepted, (\d+) errors, peak RSS after it "
                      r"\*\*([\d.]+) MiB\*\*", line)
    assert match, line
    per_body, accepted, errors = (int(match.group(i).replace(",", "")) for i in (1, 2, 3))
    assert errors == 0 and accepted == 8 * per_body  # quick mode: one body per rank
    assert float(match.group(4)) > 0
