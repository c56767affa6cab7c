from __future__ import annotations

import json
import math

import pytest

from fleetscope.push.models import RecordError, parse_records, parse_report, reports_from_records, request_body_schema


def record(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {"job": "llm", "rank": 3, "step": 10, "step_seconds": 1.5}
    base.update(overrides)
    return base


def test_single_record_and_batch_parse_to_records() -> None:
    one = parse_records(json.dumps(record(data_seconds=0.2, gpu=5)).encode())
    assert len(one) == 1 and one[0]["rank"] == 3 and one[0]["data_seconds"] == 0.2 and one[0]["gpu"] == 5
    batch = parse_records(b"  " + json.dumps([record(rank=r) for r in range(4)]).encode())
    assert [r["rank"] for r in batch] == [0, 1, 2, 3]


def test_error_names_the_field_and_the_record_in_a_batch() -> None:
    body = json.dumps([record(), record(), record(rank=-1, step_seconds="slow")]).encode()
    with pytest.raises(RecordError) as info:
        parse_records(body)
    fields = {d["field"] for d in info.value.detail}
    assert fields == {"body[2].rank", "body[2].step_seconds"}


def test_missing_required_field_is_named() -> None:
    with pytest.raises(RecordError) as info:
        parse_records(json.dumps({"job": "x", "rank": 0, "step": 1}).encode())
    assert [d["field"] for d in info.value.detail] == ["body.step_seconds"]


@pytest.mark.parametrize(
    "bad",
    [
        {"step_seconds": -1.0},
        {"data_seconds": -0.1},
        {"job": ""},
        {"job": "x" * 200},
        {"world_size": 0},
        {"tokens": -5},
        {"step": -1},
        {"comm_seconds": "Infinity"},
    ],
)
def test_out_of_range_values_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(RecordError):
        parse_records(json.dumps(record(**bad)).encode())


def test_nan_loss_is_kept_and_unknown_fields_ignored() -> None:
    (parsed,) = parse_records(b'{"job":"j","rank":0,"step":1,"step_seconds":1,"loss":NaN,"future_field":1}')
    assert math.isnan(parsed["loss"]) and "future_field" not in parsed


def test_invalid_json_is_a_record_error() -> None:
    with pytest.raises(RecordError):
        parse_records(b"[{not json")


def test_openapi_schema_accepts_object_or_array() -> None:
    schema = request_body_schema()["requestBody"]["content"]["application/json"]["schema"]
    kinds = {option.get("type") for option in schema["anyOf"]}
    assert kinds == {"object", "array"}
    assert "step_seconds" in schema["anyOf"][0]["required"]


def test_a_rank_outside_its_world_size_is_refused() -> None:
    with pytest.raises(RecordError) as info:
        parse_records(json.dumps([record(), record(rank=8, world_size=8)]).encode())
    assert [d["field"] for d in info.value.detail] == ["body[1].rank"]


def test_report_parses_to_the_same_rank_report_as_flat_records() -> None:
    flat = reports_from_records(parse_records(json.dumps(
        [record(step=1, local_rank=2, gpu="GPU-x"), record(step=2, local_rank=2, data_seconds=0.1)]).encode()))
    report = parse_report(json.dumps({
        "job": "llm", "rank": 3, "local_rank": 2, "gpu": "GPU-x",
        "steps": [{"step": 1, "step_seconds": 1.5}, {"step": 2, "step_seconds": 1.5, "data_seconds": 0.1}],
    }).encode())
    assert flat == [report]


def test_every_field_of_the_field_list_is_in_the_wire_schemas() -> None:
    from fleetscope import wire as fields

    one = request_body_schema()["requestBody"]["content"]["application/json"]["schema"]["anyOf"][0]
    assert set(one["properties"]) == {f.name for f in fields.RECORD_FIELDS}
    assert set(one["required"]) == {f.name for f in fields.RECORD_FIELDS if f.required}
    assert all(one["properties"][f.name].get("description") == f.help for f in fields.RECORD_FIELDS)


# -- #18 item 12: values that overflow a total or a label --------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"step_seconds": 1e308},
        {"comm_seconds": 2e6},
        {"tokens": 1 << 60},
        {"samples": 10**30},
        {"step": 1 << 60},
        {"gpu": 10**200},
    ],
    ids=["step_seconds", "comm_seconds", "tokens", "samples", "step", "gpu"],
)
def test_values_no_total_or_label_can_hold_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(RecordError) as info:
        parse_records(json.dumps(record(**bad)).encode())
    assert all(d["field"].startswith(f"body.{next(iter(bad))}") for d in info.value.detail)


def test_the_bounds_leave_room_for_real_values() -> None:
    (parsed,) = parse_records(json.dumps(record(step_seconds=86_400.0, tokens=1 << 40, gpu=7, step=10**9)).encode())
    assert parsed["tokens"] == 1 << 40
