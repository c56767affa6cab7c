"""The push API's wire format, derived from the field tables in :mod:`fleetscope.wire`.

Two bodies carry steps:

* ``POST /api/v1/steps``: one flat record (a JSON object) or a batch of them (a
  JSON array), each record repeating the rank's fields;
* ``POST /api/v1/report``: one rank's report: its fields once, the steps it
  completed since its last report, and its position (the open step and the
  phase it is in). :mod:`fleetscope.client` sends these, at least once a second.

Both validate into plain dicts (pydantic ``TypedDict`` validation stays in
pydantic-core: a few µs per record) and become the same :class:`RankReport`
for the store. ``parse_*`` picks the adapter from the body's first byte so an
error names the record's field (``body[3].rank``) instead of listing both
branches of a union. Unknown fields are ignored, so a newer client can talk to
an older daemon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, Required

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from fleetscope import wire
from fleetscope.wire import RANK_FIELDS, Role

_PYTHON_TYPES: dict[str, type] = {"int": int, "float": float, "str": str}
# A string field becomes a label value, which reaches `check`'s output and verdict files: one line, no
# control characters (#35 item 1).
ONE_LINE = "^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*$"


def _constrained(field: wire.Field, kind: str) -> Any:
    numeric = kind in ("int", "float")
    constraints = Field(
        ge=field.minimum if numeric else None,
        gt=field.above if numeric else None,
        le=field.maximum if numeric else None,
        lt=field.below if numeric else None,
        min_length=field.min_length if kind == "str" else None,
        max_length=field.max_length if kind == "str" else None,
        pattern=ONE_LINE if kind == "str" else None,
        allow_inf_nan=(not field.finite) if kind == "float" else None,
    )
    return Annotated[_PYTHON_TYPES[kind], constraints]


def annotation(field: wire.Field, literal: Sequence[str] = ()) -> Any:
    """The field's type with its bounds and description; ``None`` allowed unless required."""
    if literal:
        kind: Any = Literal[tuple(literal)]
    else:
        branches = [_constrained(field, kind) for kind in field.type.split("|")]
        kind = branches[0] if len(branches) == 1 else _union(branches)
    if not field.required:
        kind = kind | None
    described = Annotated[kind, Field(description=field.help)]
    return Required[described] if field.required else NotRequired[described]


def _union(branches: list[Any]) -> Any:
    union = branches[0]
    for branch in branches[1:]:
        union = union | branch
    return union


def _typed_dict(
    name: str, fields: Sequence[wire.Field], choices: Mapping[str, Sequence[str]] | None = None, **extra: Any
) -> Any:
    """A TypedDict of the fields (``choices``: fields whose value is one of a few strings), plus ``extra``."""
    annotations = {f.name: annotation(f, (choices or {}).get(f.name, ())) for f in fields}
    annotations.update(extra)
    return TypedDict(name, annotations, total=False)  # type: ignore[operator]


StepRecord = _typed_dict("StepRecord", wire.RECORD_FIELDS)
Step = _typed_dict("Step", wire.STEP_FIELDS)
Position = _typed_dict("Position", wire.POSITION_FIELDS, choices={"phase": wire.PHASES})
Report = _typed_dict(
    "Report",
    RANK_FIELDS,
    steps=NotRequired[Annotated[list[Step], Field(description="Steps completed since the last report, oldest first.")]],  # type: ignore[valid-type]
    position=NotRequired[Annotated[Position | None, Field(description="Where the rank is now.")]],
)

ONE = TypeAdapter(StepRecord)
BATCH = TypeAdapter(list[StepRecord])  # type: ignore[valid-type]
REPORT = TypeAdapter(Report)


@dataclass(frozen=True)
class RankReport:
    """What one push says about one rank: the form the store takes, whichever body carried it."""

    job: str
    rank: int
    fields: Mapping[str, Any]  # placement and process fields the push states (None ones left out)
    steps: Sequence[Mapping[str, Any]]  # step fields, oldest first
    position: Mapping[str, Any] | None = None
    lease: str | None = None  # the reporting process's secret (wire.Role.LEASE): checked, never stored as a fact


_STATED = tuple(f.name for f in RANK_FIELDS if f.role not in (Role.KEY, Role.LEASE))
(_LEASE,) = wire.names(Role.LEASE, RANK_FIELDS)
_STEP_NAMES = tuple(f.name for f in wire.STEP_FIELDS)


def _stated(values: Mapping[str, Any]) -> dict[str, Any]:
    return {name: values[name] for name in _STATED if values.get(name) is not None}


def reports_from_records(records: Sequence[Mapping[str, Any]]) -> list[RankReport]:
    """Flat records grouped per rank, in order; a rank's fields are the newest each record states."""
    grouped: dict[tuple[str, int], tuple[dict[str, Any], list[Mapping[str, Any]]]] = {}
    leases: dict[tuple[str, int], str] = {}
    for rec in records:
        stated, steps = grouped.setdefault((rec["job"], rec["rank"]), ({}, []))
        stated.update(_stated(rec))
        steps.append({name: rec[name] for name in _STEP_NAMES if rec.get(name) is not None})
        if rec.get(_LEASE) is not None:
            leases[(rec["job"], rec["rank"])] = rec[_LEASE]
    return [RankReport(job, rank, stated, steps, lease=leases.get((job, rank)))
            for (job, rank), (stated, steps) in grouped.items()]


class PushResult(BaseModel):
    accepted: int = Field(description="Step records stored.")
    duplicate: int = Field(
        0, description="Step records this rank's tracker had sent before and the daemon had stored: not counted again."
    )


class JobEndResult(BaseModel):
    job: str
    ranks_removed: int


def request_body_schema() -> dict[str, Any]:
    """OpenAPI requestBody for POST /api/v1/steps (the route reads its body itself, to bound it)."""
    one = ONE.json_schema()
    schema = {"anyOf": [one, {"type": "array", "items": one, "title": "Batch"}]}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def report_body_schema() -> dict[str, Any]:
    """OpenAPI requestBody for POST /api/v1/report."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": REPORT.json_schema()}}}}


class RecordError(ValueError):
    """A body that is not a valid record, batch or report; ``detail`` names each bad field."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{d['field']}: {d['msg']}" for d in detail))
        self.detail = detail


def _field_name(loc: tuple[Any, ...]) -> str:
    parts = ["body"]
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(f".{item}")
    return "".join(parts)


def _record_error(exc: ValidationError) -> RecordError:
    detail = [
        {"field": _field_name(tuple(err["loc"])), "msg": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False, include_input=False)[:20]
    ]
    return RecordError(detail)


def _check_rank_in_world(values: Mapping[str, Any], where: str) -> None:
    world, rank = values.get("world_size"), values.get("rank")
    if world is not None and rank is not None and rank >= world:
        raise RecordError([{
            "field": f"{where}.rank",
            "msg": f"rank {rank} is outside world_size {world}",
            "type": "rank_outside_world",
        }])


def parse_records(body: bytes) -> list[Mapping[str, Any]]:
    """Validate a JSON body of one record or a batch. Raises :class:`RecordError`."""
    batch = body.lstrip()[:1] == b"["
    try:
        records: list[Mapping[str, Any]] = BATCH.validate_json(body) if batch else [ONE.validate_json(body)]
    except ValidationError as exc:
        raise _record_error(exc) from None
    for index, rec in enumerate(records):
        _check_rank_in_world(rec, f"body[{index}]" if batch else "body")
    return records


def parse_report(body: bytes) -> RankReport:
    """Validate a JSON body of one rank's report. Raises :class:`RecordError`."""
    try:
        values: Mapping[str, Any] = REPORT.validate_json(body)
    except ValidationError as exc:
        raise _record_error(exc) from None
    _check_rank_in_world(values, "body")
    return RankReport(
        values["job"], values["rank"], _stated(values), values.get("steps") or [], values.get("position"),
        values.get(_LEASE),
    )
