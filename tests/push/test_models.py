from __future__ import annotations

import json
import math

import pytest

from fleetscope.push.models import RecordError, parse_records, request_body_schema


def record(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {"job": "llm", "rank": 3, "step": 10, "step_seconds": 1.5}
    base.update(overrides)
    return base


def test_single_record_and_batch_parse_to_records() -> None:
    one = parse_records(json.dumps(record(data_seconds=0.2, gpu=5)).encode())
    assert len(one) == 1 and one[0].rank == 3 and one[0].data_seconds == 0.2 and one[0].gpu == 5
    batch = parse_records(b"  " + json.dumps([record(rank=r) for r in range(4)]).encode())
    assert [r.rank for r in batch] == [0, 1, 2, 3]


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
    assert parsed.loss is not None and math.isnan(parsed.loss)


def test_invalid_json_is_a_record_error() -> None:
    with pytest.raises(RecordError):
        parse_records(b"[{not json")


def test_openapi_schema_accepts_object_or_array() -> None:
    schema = request_body_schema()["requestBody"]["content"]["application/json"]["schema"]
    kinds = {option.get("type") for option in schema["anyOf"]}
    assert kinds == {"object", "array"}
    assert "step_seconds" in schema["anyOf"][0]["required"]
