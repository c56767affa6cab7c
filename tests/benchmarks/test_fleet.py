"""The fleet benchmark's data (benchmarks/fleet.py): one node's series copied into a fleet, served as targets."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.fleet import (
    JOBS,
    SLOW_JOBS,
    TAKEN_AT,
    FleetServer,
    GroupResult,
    Kind,
    QueryResult,
    SizeResult,
    TemplateSeries,
    fleet_series,
    load_template,
    main,
    outputs,
    per_minute,
    per_round,
    render,
    render_node,
    rules_for_bench,
    scrape_config,
    template,
)
from benchmarks.harness import http_get
from tests.conftest import ROOT

NODE = """\
# HELP fleetscope_training_steps_total Steps.
# TYPE fleetscope_training_steps_total counter
fleetscope_training_steps_total{local_rank="0",pp_stage="",rank="0",training_job="llama"} 1.0
fleetscope_training_steps_total{local_rank="1",pp_stage="",rank="1",training_job="llama"} 1.0
# HELP fleetscope_training_compute_seconds_total Compute.
# TYPE fleetscope_training_compute_seconds_total counter
fleetscope_training_compute_seconds_total{local_rank="0",pp_stage="",rank="0",training_job="llama"} 0.78
fleetscope_training_compute_seconds_total{local_rank="2",pp_stage="",rank="2",training_job="llama"} 0.78
# HELP fleetscope_gpu_temperature_celsius Temperature.
# TYPE fleetscope_gpu_temperature_celsius gauge
fleetscope_gpu_temperature_celsius{gpu="3",uuid="GPU-3"} 60.5
# HELP fleetscope_training_last_push_timestamp_seconds Last push.
# TYPE fleetscope_training_last_push_timestamp_seconds gauge
fleetscope_training_last_push_timestamp_seconds{local_rank="0",pp_stage="",rank="0",training_job="llama"} 1000.0
# HELP fleetscope_training_phase Phase.
# TYPE fleetscope_training_phase gauge
fleetscope_training_phase{local_rank="0",phase="compute",pp_stage="",rank="0",training_job="llama"} 1.0
"""
LABELS = re.compile(r'(\w+)="([^"]*)"')


def node() -> list[TemplateSeries]:
    return template(NODE, taken=1002.0)


def labels_of(prefix: str) -> dict[str, str]:
    return dict(LABELS.findall(prefix))


def test_template_reads_how_each_series_moves() -> None:
    series = node()
    assert [(s.name, s.kind) for s in series] == [
        ("fleetscope_training_steps_total", Kind.COUNTER), ("fleetscope_training_steps_total", Kind.COUNTER),
        ("fleetscope_training_compute_seconds_total", Kind.COUNTER),
        ("fleetscope_training_compute_seconds_total", Kind.COUNTER),
        ("fleetscope_gpu_temperature_celsius", Kind.GAUGE),
        ("fleetscope_training_last_push_timestamp_seconds", Kind.CLOCK),
        ("fleetscope_training_phase", Kind.LEVEL)]
    assert series[5].value == 2.0  # its age when the template was taken


def test_clocks_keep_up_and_flags_stay_flags() -> None:
    (own,) = fleet_series(1, node())
    body = render_node(own, elapsed=60.0, wobble=1.01, now=5000.0).decode()
    values = {line.rsplit(" ", 1)[0].split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in body.splitlines()}
    assert values["fleetscope_training_last_push_timestamp_seconds"] == 4998.0
    assert values["fleetscope_training_phase"] == 1.0  # `phase == 1` still matches
    assert values["fleetscope_gpu_temperature_celsius"] == pytest.approx(60.5 * 1.01)


def test_every_rank_has_its_place_in_its_job() -> None:
    nodes = 2 * JOBS
    fleet = fleet_series(nodes, node())
    assert len(fleet) == nodes and {len(own) for own in fleet} == {len(node())}
    steps = [labels_of(s.prefix) for own in fleet for s in own
             if s.prefix.startswith("fleetscope_training_steps_total")]
    assert len({(s["training_job"], s["rank"]) for s in steps}) == len(steps) == nodes * 2
    assert {s["training_job"] for s in steps} == {f"job-{j:02d}" for j in range(JOBS)}
    assert {s["rank"] for s in steps if s["training_job"] == "job-00"} == {"0", "1", "8", "9"}
    assert not any("instance" in labels_of(s.prefix) for own in fleet for s in own)  # Prometheus adds it


def test_a_slow_rank_computes_longer_and_its_job_steps_slower() -> None:
    fleet = fleet_series(JOBS, node())
    rates = {(lab["training_job"], lab["rank"], s.prefix.split("{")[0]): s.rate
             for own in fleet for s in own if "training_job" in (lab := labels_of(s.prefix))}
    slow, healthy = f"job-{SLOW_JOBS[0]:02d}", "job-00"
    compute = "fleetscope_training_compute_seconds_total"
    assert rates[(slow, "2", compute)] > rates[(healthy, "2", compute)]
    steps = "fleetscope_training_steps_total"
    assert rates[(slow, "0", steps)] < rates[(healthy, "0", steps)]


def test_a_slow_rank_reports_a_longer_compute_median() -> None:
    text = NODE + """\
# HELP fleetscope_training_compute_seconds_median Compute median.
# TYPE fleetscope_training_compute_seconds_median gauge
fleetscope_training_compute_seconds_median{local_rank="2",pp_stage="",rank="2",training_job="llama"} 0.78
"""
    fleet = fleet_series(JOBS, template(text))
    medians = {labels_of(s.prefix)["training_job"]: s.base for own in fleet for s in own
               if s.prefix.startswith("fleetscope_training_compute_seconds_median")}
    assert medians[f"job-{SLOW_JOBS[0]:02d}"] > 1.2 * medians["job-00"]


def test_each_node_is_a_target_whose_counters_grow() -> None:
    fleet = fleet_series(3, node())
    with FleetServer(fleet) as server:
        first = http_get(server.port, "/node/2/metrics")
        time.sleep(0.05)
        second = http_get(server.port, "/node/2/metrics")
        assert http_get(server.port, "/node/3/metrics")[0] == 404
    assert first[0] == second[0] == 200
    values = [{(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(body.decode())
               for s in f.samples} for _, body in (first, second)]
    assert len(values[0]) == len(node())
    steps = [key for key in values[0] if key[0] == "fleetscope_training_steps_total"]
    assert steps and all(values[1][key] > values[0][key] for key in steps)
    config = scrape_config(3, server.port, 30)
    assert [c["labels"]["instance"] for c in config["static_configs"]] == ["p5-00000:9402", "p5-00001:9402",
                                                                        "p5-00002:9402"]
    assert config["static_configs"][2]["labels"]["__metrics_path__"] == "/node/2/metrics"


def test_every_shipped_group_is_evaluated_at_its_shipped_interval(tmp_path: Path) -> None:
    intervals = rules_for_bench(Path(ROOT) / "alerts" / "fleetscope.rules.yml", tmp_path / "rules.yml")
    groups = yaml.safe_load((tmp_path / "rules.yml").read_text(encoding="utf-8"))["groups"]
    assert [g["name"] for g in groups] == list(intervals) and len(intervals) > 10
    # Each at its shipped interval, the global one (1m) where it ships none: range reads of records see as many
    # samples as production writes.
    assert intervals["fleetscope-rank-gpu.rules"] == 30 and intervals["fleetscope-gpu"] == 60
    assert intervals["fleetscope-repeat-offenders"] == 600
    shipped = yaml.safe_load((Path(ROOT) / "alerts" / "fleetscope.rules.yml").read_text(encoding="utf-8"))["groups"]
    assert groups == shipped


def test_the_report_shows_work_read_and_the_slowest_rules() -> None:
    def size(nodes: int, scale: int) -> SizeResult:
        group = GroupResult(evaluations={1.0: 0.1 * scale, 2.0: 0.2 * scale}, seconds=0.3 * scale, samples=10.0 * scale,
                            rules=2, samples_read=1000 * scale,
                            rule_seconds={"TrainingJobHang": [0.05 * scale, 0.07 * scale], "rank:x:y": [0.01]})
        return SizeResult(nodes, 900 * nodes, targets_up=nodes, groups={"fleetscope-progress": group},
                          queries=[QueryResult("fleetscope-fleet", "Jobs", "A", 0.01 * scale, "success", 1)],
                          appended=[(0.0, 0.0), (1.0, 10.0)])

    text = render([size(512, 1), size(2048, 4)], "today", "a machine", 60.0, 6.0, 30)
    row = next(line for line in text.splitlines() if line.startswith("| `fleetscope-progress`"))
    assert "| 1,000 | 4,000 |" in row and "4.0× (4× nodes)" in row  # samples read and their growth
    slowest = [line for line in text.splitlines() if line.startswith("| `TrainingJobHang`")]
    assert slowest == ["| `TrainingJobHang` | `fleetscope-progress` | 0.280 | 0.280 |"]


def test_a_short_run_evaluates_the_slow_groups_often_but_counts_them_at_their_shipped_interval(tmp_path: Path) -> None:
    shipped = rules_for_bench(Path(ROOT) / "alerts" / "fleetscope.rules.yml", tmp_path / "rules.yml", "1m")
    groups = {g["name"]: g for g in yaml.safe_load((tmp_path / "rules.yml").read_text(encoding="utf-8"))["groups"]}
    assert groups["fleetscope-repeat-offenders"]["interval"] == "1m" and shipped["fleetscope-repeat-offenders"] == 600
    assert groups["fleetscope-rank-gpu.rules"]["interval"] == "30s"  # faster ones stay as shipped
    slow = GroupResult(samples_read=6000, interval_seconds=600)
    fast = GroupResult(samples_read=100, interval_seconds=30)
    assert per_round(slow) == 600 and per_round(fast) == 100 and per_minute(fast) == 200


def test_report_and_results_go_to_a_file_or_a_directory(tmp_path: Path) -> None:
    assert outputs(str(tmp_path / "r.md"), "") == (tmp_path / "r.md", None)
    report, raw = outputs(f"{tmp_path}/out/", "")
    assert (report, raw) == (tmp_path / "out" / "benchmarks-fleet.md", tmp_path / "out" / "fleet.json")
    assert (tmp_path / "out").is_dir()


def test_a_saved_template_keeps_the_clocks_ages(tmp_path: Path) -> None:
    """A template saved hours before the run reads its last-push times as ages from when it was taken."""
    saved = tmp_path / "node.prom"
    saved.write_text(f"{TAKEN_AT}1002.0\n{NODE}", encoding="utf-8")
    clocks = [s for s in load_template(saved) if s.kind is Kind.CLOCK]
    assert clocks and all(s.value == 2.0 for s in clocks)
    (tmp_path / "plain.prom").write_text(NODE, encoding="utf-8")
    with pytest.raises(SystemExit, match="not a --write-template file"):
        load_template(tmp_path / "plain.prom")
    with pytest.raises(SystemExit, match="executable prometheus"):
        main(["--template", str(saved), "--prometheus", str(tmp_path / "none"), "--out", f"{tmp_path}/o/"])
