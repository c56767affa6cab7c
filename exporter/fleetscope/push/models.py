"""The push API's wire format: one pydantic model for a step record.

A body is one record (a JSON object) or a batch (a JSON array). A batch is
validated in one ``TypeAdapter`` call, which stays in pydantic-core and costs
about 2 µs per record; ``parse_records`` picks the adapter from the body's
first byte so an error names the record's field (``body[3].rank``) instead of
listing both branches of a union.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

# Bounds that keep one pusher from blowing up label cardinality or memory.
MAX_ID_LENGTH = 128
MAX_RANK = 1 << 24

Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]


class StepRecord(BaseModel):
    """One completed training step of one rank."""

    # Unknown fields are ignored so that a newer client can talk to an older daemon.
    model_config = ConfigDict(extra="ignore", frozen=True)

    job: Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, description="Training job id.")]
    rank: Annotated[int, Field(ge=0, lt=MAX_RANK, description="Global rank of the pushing process.")]
    step: Annotated[int, Field(ge=0, description="Step number (optimizer updates so far).")]
    step_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False, description="Wall time of the step.")]
    data_seconds: Seconds | None = Field(None, description="Time spent waiting for input data.")
    compute_seconds: Seconds | None = Field(
        None, description="The rank's own work (forward, backward, optimizer), excluding collective waits."
    )
    comm_seconds: Seconds | None = Field(None, description="Exposed wait in collective communication.")
    tokens: Count | None = Field(None, description="Tokens processed by this rank in the step.")
    samples: Count | None = Field(None, description="Samples processed by this rank in the step.")
    loss: float | None = Field(
        None, description="Loss of the step (NaN and infinities allowed: they are news)."
    )
    local_rank: Annotated[int, Field(ge=0, lt=MAX_RANK)] | None = None
    world_size: Annotated[int, Field(ge=1, le=MAX_RANK)] | None = None
    pp_stage: Annotated[int, Field(ge=0, lt=MAX_RANK)] | None = None
    dp_rank: Annotated[int, Field(ge=0, lt=MAX_RANK)] | None = None
    gpu: Annotated[int, Field(ge=0)] | Annotated[str, Field(max_length=MAX_ID_LENGTH)] | None = Field(
        None, description="GPU index or UUID the rank runs on."
    )
    timestamp: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="Unix time the step completed (default: when the daemon received it)."
    )


class PushResult(BaseModel):
    accepted: int = Field(description="Records stored.")


class JobEndResult(BaseModel):
    job: str
    ranks_removed: int


ONE = TypeAdapter(StepRecord)
BATCH = TypeAdapter(list[StepRecord])


def request_body_schema() -> dict[str, Any]:
    """OpenAPI requestBody for POST /api/v1/steps (the route reads its body itself, to bound it)."""
    record = StepRecord.model_json_schema()
    schema = {"anyOf": [record, {"type": "array", "items": record, "title": "Batch"}]}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


class RecordError(ValueError):
    """A body that is not a valid record or batch; ``detail`` names each bad field."""

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


def parse_records(body: bytes) -> list[StepRecord]:
    """Validate a JSON body of one record or a batch. Raises :class:`RecordError`."""
    batch = body.lstrip()[:1] == b"["
    try:
        if batch:
            return BATCH.validate_json(body)
        return [ONE.validate_json(body)]
    except ValidationError as exc:
        detail = [
            {"field": _field_name(tuple(err["loc"])), "msg": err["msg"], "type": err["type"]}
            for err in exc.errors(include_url=False, include_input=False)[:20]
        ]
        raise RecordError(detail) from None
