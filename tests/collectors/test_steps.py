from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from fleetscope.collectors.steps import StepsCollector
from fleetscope.config import load
from fleetscope.metrics import MetricSpec
from fleetscope.push.models import reports_from_records
from fleetscope.push.textformat import parse_exposition
from tests.clocks import FakeClock


def record(**fields: object) -> dict[str, object]:
    return fields


def samples(collector: StepsCollector) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in collector.collect()
        for s in family.samples
    }


def labels(
    job: str = "j", rank: str = "0", local_rank: str = "", pp_stage: str = ""
) -> frozenset[tuple[str, str]]:
    return frozenset(
        {"training_job": job, "rank": rank, "local_rank": local_rank, "pp_stage": pp_stage}.items()
    )


def make(**flags: object) -> tuple[StepsCollector, FakeClock]:
    clock = FakeClock(2_000_000.0)
    return StepsCollector(load(flags=flags, environ={}), clock=clock), clock


def test_rank_series_names_labels_and_values() -> None:
    collector, clock = make()
    collector.store.ingest(reports_from_records(
        [
            record(
                job="j",
                rank=0,
                step=s,
                step_seconds=2.0,
                data_seconds=0.5,
                compute_seconds=1.0,
                comm_seconds=0.5,
                tokens=1000,
                samples=8,
                loss=1.5,
                local_rank=0,
                pp_stage=1,
                dp_rank=0,
                world_size=16,
                gpu=3,
                timestamp=clock.now - 1,
            )
            for s in range(1, 4)
        ]
    ))
    got = samples(collector)
    lab = labels(local_rank="0", pp_stage="1")
    assert got[("fleetscope_training_steps_total", lab)] == 3
    assert got[("fleetscope_training_step_seconds_total", lab)] == 6.0
    assert got[("fleetscope_training_data_seconds_total", lab)] == 1.5
    assert got[("fleetscope_training_compute_seconds_total", lab)] == 3.0
    assert got[("fleetscope_training_comm_seconds_total", lab)] == 1.5
    assert got[("fleetscope_training_tokens_total", lab)] == 3000
    assert got[("fleetscope_training_samples_total", lab)] == 24
    assert got[("fleetscope_training_last_step", lab)] == 3
    assert got[("fleetscope_training_last_step_timestamp_seconds", lab)] == clock.now - 1
    assert got[("fleetscope_training_last_push_timestamp_seconds", lab)] == clock.now
    assert got[("fleetscope_training_loss", lab)] == 1.5
    assert got[("fleetscope_training_compute_seconds_median", lab)] == 1.0
    info = lab | {("dp_rank", "0"), ("world_size", "16"), ("gpu", "3")}
    assert got[("fleetscope_training_rank_info", info)] == 1


def test_missing_fields_are_absent_not_zero() -> None:
    collector, _ = make()
    collector.store.ingest(reports_from_records([record(job="j", rank=0, step=1, step_seconds=1.0)]))
    names = {name for name, lab in samples(collector) if lab == labels()}
    assert "fleetscope_training_steps_total" in names
    for absent in (
        "data_seconds_total",
        "compute_seconds_total",
        "comm_seconds_total",
        "tokens_total",
        "samples_total",
        "loss",
        "data_seconds_median",
    ):
        assert f"fleetscope_training_{absent}" not in names


def test_names_are_the_contract_and_in_the_tables() -> None:
    declared = {spec.name for table in StepsCollector.tables for spec in table}
    contract = {
        "fleetscope_training_steps_total",
        "fleetscope_training_step_seconds_total",
        "fleetscope_training_data_seconds_total",
        "fleetscope_training_compute_seconds_total",
        "fleetscope_training_comm_seconds_total",
        "fleetscope_training_tokens_total",
        "fleetscope_training_samples_total",
        "fleetscope_training_last_step",
        "fleetscope_training_last_step_timestamp_seconds",
        "fleetscope_training_last_push_timestamp_seconds",
        "fleetscope_training_loss",
        "fleetscope_training_step_seconds_median",
        "fleetscope_training_data_seconds_median",
        "fleetscope_training_compute_seconds_median",
        "fleetscope_training_comm_seconds_median",
        "fleetscope_training_rank_info",
        "fleetscope_push_records_total",
        "fleetscope_push_rejected_total",
        "fleetscope_push_jobs",
        "fleetscope_push_ranks",
        "fleetscope_push_expired_total",
    }
    assert contract <= declared
    collector, _ = make()
    collector.store.ingest(reports_from_records(
        [
            record(
                job="j",
                rank=0,
                step=1,
                step_seconds=1.0,
                data_seconds=0.1,
                compute_seconds=0.1,
                comm_seconds=0.1,
                tokens=1,
                samples=1,
                loss=0.1,
            )
        ]
    ))
    suffix = {"counter": "_total", "info": "_info", "gauge": ""}
    exported = {family.name + suffix[family.type] for family in collector.collect()}
    assert exported <= declared
    for table in StepsCollector.tables:
        for spec in table:
            assert isinstance(spec, MetricSpec)
            assert "job" not in spec.labels  # Prometheus's own target label (docs/design.md)


def test_expired_rank_disappears_and_is_counted() -> None:
    collector, clock = make(**{"push.rank-ttl": "10m"})
    collector.store.ingest(reports_from_records([record(job="j", rank=0, step=1, step_seconds=1.0)]))
    clock.now += 601
    got = samples(collector)
    assert not any(name.startswith("fleetscope_training_") for name, _ in got)
    assert got[("fleetscope_push_expired_total", frozenset({("kind", "rank")}))] == 1
    assert got[("fleetscope_push_ranks", frozenset())] == 0


def test_pushed_groups_are_exposed_with_training_job_label() -> None:
    collector, clock = make()
    key = (("job", "nightly"), ("rank", "2"))
    collector.groups.push(key, parse_exposition('# TYPE acc gauge\nacc{split="val"} 0.9\n', key), True)
    got = samples(collector)
    assert got[("acc", frozenset({("training_job", "nightly"), ("rank", "2"), ("split", "val")}))] == 0.9
    stamp = (
        "fleetscope_push_group_last_push_timestamp_seconds",
        frozenset({("training_job", "nightly"), ("rank", "2")}),
    )
    assert got[stamp] == clock.now
    assert got[("fleetscope_push_groups", frozenset())] == 1


def test_pushed_groups_follow_every_push_delete_and_expiry_while_unchanged_ones_are_reused() -> None:
    collector, clock = make(**{"push.group-ttl": "10m"})
    a, b = (("job", "a"),), (("job", "b"),)

    def pushed() -> dict[str, float]:
        return {s.labels["training_job"]: s.value for f in collector.collect() if f.name == "acc" for s in f.samples}

    collector.groups.push(a, parse_exposition("# TYPE acc gauge\nacc 1\n", a), True)
    collector.groups.push(b, parse_exposition("# TYPE acc gauge\nacc 2\n", b), True)
    first = next(f for f in collector.collect() if f.name == "acc")
    assert next(f for f in collector.collect() if f.name == "acc") is first  # nothing pushed: not merged again
    collector.groups.push(a, parse_exposition("# TYPE acc gauge\nacc 3\n", a), True)
    assert pushed() == {"a": 3, "b": 2}
    collector.groups.push(b, parse_exposition("# TYPE other gauge\nother 1\n", b), False)  # POST: acc kept
    assert pushed() == {"a": 3, "b": 2}
    collector.groups.delete(a)
    assert pushed() == {"b": 2}
    clock.now += 301
    collector.groups.push(a, parse_exposition("# TYPE acc gauge\nacc 4\n", a), True)
    clock.now += 301  # b unpushed for 10 min 2 s: expired
    assert pushed() == {"a": 4}


def test_exposition_is_valid_in_both_formats() -> None:
    collector, _ = make()
    collector.store.ingest(
        reports_from_records(
            [record(job="j", rank=r, step=1, step_seconds=1.0, loss=math.nan, tokens=5) for r in range(3)]
        )
    )
    key = (("job", "g"),)
    collector.groups.push(
        key, parse_exposition('# TYPE c_total counter\nc_total 4\nh_bucket{le="+Inf"} 1\n', key), True
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert "fleetscope_training_loss" in text
    families = {f.name: f for f in parse_openmetrics(generate_openmetrics(registry).decode())}
    assert families["fleetscope_training_steps"].type == "counter"
    assert families["c"].type == "counter"
    assert len(families["fleetscope_training_steps"].samples) == 3


def test_a_full_client_python_push_stays_valid_openmetrics() -> None:
    from prometheus_client import Counter, Enum, Gauge, Histogram, Info, Summary

    pushed = CollectorRegistry()
    Counter("examples", "Examples.", ["split"], registry=pushed).labels("train").inc(5)
    Histogram("latency_seconds", "Latency.", registry=pushed).observe(0.3)
    Summary("batch_seconds", "Batch.", registry=pushed).observe(2)
    Info("build", "Build.", registry=pushed).info({"version": "1"})
    Enum("phase", "Phase.", states=["train", "eval"], registry=pushed)
    Gauge("lr", "Learning rate.", registry=pushed).set(0.001)
    collector, _ = make()
    key = (("job", "nightly"),)
    collector.groups.push(key, parse_exposition(generate_latest(pushed).decode(), key), True)
    other = (("job", "other"),)  # a second group's gauge clashing with the first group's counter
    collector.groups.push(other, parse_exposition("examples_created 1\n", other), True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    families = {f.name: f for f in parse_openmetrics(generate_openmetrics(registry).decode())}
    assert families["examples"].type == "counter"
    assert families["latency_seconds"].type == "histogram"
    assert families["batch_seconds"].type == "summary"
    assert "lr" in families and "build_info" in families and "phase" in families
    assert "examples_created" not in families


def test_every_value_of_the_step_table_is_one_the_store_derives_from_the_field_list() -> None:
    from fleetscope import wire
    from fleetscope.collectors.steps import RANK_LABELS
    from fleetscope.metrics import training

    assert {key for key, spec in training.TABLE.specs.items() if spec.kind != "info"} == set(wire.value_keys())
    assert set(training.RANK_INFO.info_keys) == set(wire.names(wire.Role.INFO, wire.RANK_FIELDS))
    assert all(spec.labels == RANK_LABELS for spec in training.TABLE)
    assert training.RANK_LABELS == RANK_LABELS


def test_position_is_one_series_per_phase_with_its_start_and_step() -> None:
    from fleetscope.push.models import RankReport
    from fleetscope.wire import PHASES

    collector, clock = make()
    position = {"step": 12, "phase": "comm", "since": clock.now - 3}
    collector.store.ingest([RankReport("j", 0, {"pid": 5, "start_time": 1}, [], position)])
    got = samples(collector)
    phases = {
        dict(lab)["phase"]: value for (name, lab), value in got.items() if name == "fleetscope_training_phase"
    }
    assert phases == {phase: (1.0 if phase == "comm" else 0.0) for phase in PHASES}
    assert got[("fleetscope_training_phase_start_timestamp_seconds", labels())] == clock.now - 3
    assert got[("fleetscope_training_current_step", labels())] == 12
    assert got[("fleetscope_training_steps_total", labels())] == 0
    assert ("fleetscope_training_last_step", labels()) not in got  # no step completed yet: absent, not 0


def test_process_up_while_the_rank_runs_zero_once_it_died_absent_after_goodbye(tmp_path: object) -> None:
    from pathlib import Path

    from fleetscope.push.models import RankReport
    from tests.push.test_process import add_process, remove_process

    procfs = Path(str(tmp_path))
    add_process(procfs, 500, start=777)
    add_process(procfs, 501, start=778)
    collector, clock = make(**{"path.procfs": str(procfs)})
    position = {"step": 3, "phase": "comm", "since": clock.now}
    collector.store.ingest([
        RankReport("j", 0, {"pid": 500, "start_time": 777}, [], position),
        RankReport("j", 1, {"pid": 501, "start_time": 778}, [], position),
        RankReport("j", 2, {}, [], position),  # an older client: no process to watch
    ])
    up = "fleetscope_training_process_up"
    got = samples(collector)
    assert (got[(up, labels(rank="0"))], got[(up, labels(rank="1"))]) == (1, 1)
    assert (up, labels(rank="2")) not in got
    remove_process(procfs, 500)  # killed
    collector.store.ingest([RankReport("j", 1, {"pid": 501, "start_time": 778}, [],
                                       {**position, "phase": "ended"})])
    remove_process(procfs, 501)  # exited after saying goodbye
    got = samples(collector)
    assert got[(up, labels(rank="0"))] == 0
    assert (up, labels(rank="1")) not in got


def test_every_timestamp_of_a_scrape_is_on_its_clock_reading_across_a_wall_clock_step() -> None:
    """#30 item 4: Prometheus places the node's timestamps on its own clock with the scrape's clock reading
    (fleetscope_push_scrape_timestamp_seconds): the offset a step of the node's clock adds cancels out."""
    collector, clock = make()
    lab = labels()
    true_time = clock.now  # Prometheus's clock, which no one sets
    seen = []
    for second in range(120):
        if second == 60:
            clock.step(-600)
        clock.now += 1
        true_time += 1
        proc = {"pid": 7, "start_time": 1}
        collector.store.ingest(reports_from_records([record(job="j", rank=0, step=second + 1, step_seconds=1.0,
                                                           timestamp=clock.now - 0.5, **proc)]))
        got = samples(collector)
        offset = true_time - got[("fleetscope_push_scrape_timestamp_seconds", frozenset())]
        seen.append((got[("fleetscope_training_last_step_timestamp_seconds", lab)] + offset,
                     got[("fleetscope_training_last_push_timestamp_seconds", lab)] + offset))
    assert [step for step, _ in seen] == [pytest.approx(true_time - 119.5 + n) for n in range(120)]
    assert [push for _, push in seen] == [pytest.approx(true_time - 119 + n) for n in range(120)]
    assert not any(name == "fleetscope_push_rejected_total" for name, _ in samples(collector))  # nothing refused
