"""HTTP routes of the push API (FastAPI), mounted on the ``"push"`` app.

* ``POST /api/v1/steps``: one step record or a batch (see :mod:`.models`).
* ``POST /api/v1/report``: one rank's report: its steps since the last one and its position.
* ``DELETE /api/v1/jobs/{job}``: the job ended; its series go at once.
* ``PUT``/``POST``/``DELETE /metrics/job/<job>{/<label>/<value>}``: Pushgateway groups.

Bodies are read as a stream and cut off at ``push.max-body-bytes`` (a declared
Content-Length over the limit is refused before reading anything), so a
client cannot make the daemon buffer an unbounded body. Large bodies are
validated and stored on the threadpool, keeping the event loop free for
other pushers.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from fleetscope.config import PushConfig
from fleetscope.push.grouping import GroupError, parse_group_path
from fleetscope.push.groups import GroupLimitExceeded, GroupStore
from fleetscope.push.models import (
    JobEndResult,
    PushResult,
    RankReport,
    RecordError,
    parse_records,
    parse_report,
    report_body_schema,
    reports_from_records,
    request_body_schema,
)
from fleetscope.push.store import LeaseHeld, LimitExceeded, StepStore
from fleetscope.push.textformat import GroupTooLarge, parse_exposition

LEASE_HEADER = "fleetscope-lease"  # DELETE /api/v1/jobs/<job> from a rank of the job: its lease
INLINE_BODY_BYTES = 64 * 1024  # below this, parsing on the event loop is cheaper than a thread hop
LIMIT_RETRY_AFTER = 60  # seconds: limits free up as groups and ranks expire or jobs end
BUSY_RETRY_AFTER = 1  # seconds: bodies in flight are stored within moments
T = TypeVar("T")


class PushRefused(Exception):
    """Ends a push with an HTTP status and a message (after counting the rejection)."""

    def __init__(self, status: int, reason: str, detail: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(str(detail))
        self.status = status
        self.reason = reason
        self.detail = detail
        self.headers = headers


def _error(status: int, detail: Any, description: str) -> dict[int | str, dict[str, Any]]:
    return {
        status: {"description": description, "content": {"application/json": {"example": {"detail": detail}}}}
    }


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **_error(401, "missing or wrong bearer token", "Push token required (push.token)."),
    **_error(413, "body exceeds 1048576 bytes (push.max-body-bytes)",
             "Body too large, or a group with more samples than push.max-group-samples."),
    **_error(
        429,
        "push would track 17 jobs; this node allows 16 (push.max-jobs)",
        "Limit on jobs, ranks, groups or pushed samples reached; nothing from this push was stored "
        "(Retry-After says when to try again).",
    ),
    **_error(503, "1048576 body bytes of pushes in flight; this node holds at most 4194304 (push.max-inflight-bytes)",
             "Too many push bodies in flight at once; nothing was read (Retry-After says when to try again)."),
}


class InflightBudget:
    """Body bytes held by pushes being read, parsed and stored, against ``push.max-inflight-bytes``.

    A push reserves its declared Content-Length (the body limit when it declares none) before reading
    anything, so a storm of concurrent pushes is refused with 503 instead of buffered (#18 item 6).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()  # released from the threadpool too

    @asynccontextmanager
    async def hold(self, request: Request, body_limit: int) -> AsyncIterator[None]:
        declared = request.headers.get("content-length", "")
        size = min(int(declared), body_limit) if declared.isdigit() else body_limit
        with self._lock:
            if self._held and self._held + size > self.limit:
                raise PushRefused(503, "busy", f"{self._held} body bytes of pushes in flight; this node holds at "
                                  f"most {self.limit} (push.max-inflight-bytes)",
                                  headers={"Retry-After": str(BUSY_RETRY_AFTER)})
            self._held += size
        try:
            yield
        finally:
            with self._lock:
                self._held -= size


async def read_bounded(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything over ``limit`` bytes without buffering it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError:
            raise PushRefused(400, "invalid", "Content-Length is not a number") from None
        if declared_bytes > limit:
            raise PushRefused(
                413,
                "too_large",
                f"body of {declared_bytes} bytes exceeds {limit} bytes (push.max-body-bytes)",
            )
    chunks: list[bytes] = []
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise PushRefused(413, "too_large", f"body exceeds {limit} bytes (push.max-body-bytes)")
            chunks.append(chunk)
    except ClientDisconnect:
        # The client hung up, or the server closed it for sending too slowly (web.read-timeout).
        raise PushRefused(400, "incomplete", "the body did not arrive whole") from None
    return b"".join(chunks)


async def _maybe_offload(size: int, work: Callable[[], T]) -> T:
    if size <= INLINE_BODY_BYTES:
        return work()
    return await run_in_threadpool(work)


def _naming_setting(exc: GroupTooLarge | GroupLimitExceeded) -> str:
    """The group store's refusal, with the daemon setting that sets the limit it names (``push.max-samples``)."""
    return f"{exc} (push.{exc.limit.replace('_', '-')})"


def build_router(store: StepStore, groups: GroupStore, config: PushConfig) -> APIRouter:
    inflight = InflightBudget(max(config.max_inflight_bytes, config.max_body_bytes))

    expected = config.token.strip().encode()  # trimmed at both ends: a token file's newline is no part of it

    def require_token(request: Request) -> None:
        if not expected:
            return
        header = request.headers.get("authorization", "")
        scheme, _, supplied = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(supplied.strip().encode(), expected):
            raise PushRefused(
                401,
                "unauthorized",
                "missing or wrong bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="fleetscope push"'},
            )

    def refused(exc: PushRefused) -> JSONResponse:
        store.rejected.inc(exc.reason)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)

    router = APIRouter(tags=["push"])

    async def push(request: Request, parse: Callable[[bytes], list[RankReport]]) -> Any:
        try:
            require_token(request)
            async with inflight.hold(request, config.max_body_bytes):
                return await store_push(await read_bounded(request, config.max_body_bytes), parse)
        except PushRefused as exc:
            return refused(exc)

    async def store_push(body: bytes, parse: Callable[[bytes], list[RankReport]]) -> PushResult:
        def store_body() -> PushResult:
            try:
                reports = parse(body)
            except RecordError as exc:
                raise PushRefused(422, "invalid", exc.detail) from None
            try:
                result = store.ingest(reports)
            except LimitExceeded as exc:
                raise PushRefused(429, "limit", str(exc)) from None
            except LeaseHeld as exc:
                raise PushRefused(409, "lease", str(exc)) from None
            return PushResult(accepted=result.accepted, duplicate=result.duplicate)

        return await _maybe_offload(len(body), store_body)

    all_or_nothing = (
        "If any record is invalid (422, naming the field) or the push would exceed the node's limits on jobs or "
        "ranks (429), nothing from it is stored. Within one run of a rank's tracker (same `pid`, `start_time` "
        "and `session`), a step at or below the last one stored is a re-send, acknowledged and not counted again "
        "(`duplicate`), unless it completed after every stored step (the job went back to a checkpoint)."
    )
    push_responses: dict[int | str, dict[str, Any]] = {
        **ERROR_RESPONSES,
        **_error(409, "rank 0 of job 'j' belongs to a live process, and this push does not carry its lease",
                 "The rank's process is alive and holds its lease; nothing from this push was stored."),
        422: {"description": "A record is invalid; `detail` names each bad field."},
    }

    @router.post(
        "/api/v1/steps",
        response_model=PushResult,
        response_model_exclude_defaults=True,  # duplicate only when some were
        summary="Push one training step record or a batch of them.",
        description=f"Body: one record (object) or a batch (array). {all_or_nothing}",
        openapi_extra=request_body_schema(),
        responses=push_responses,
    )
    async def push_steps(request: Request) -> Any:
        return await push(request, lambda body: reports_from_records(parse_records(body)))

    @router.post(
        "/api/v1/report",
        response_model=PushResult,
        response_model_exclude_defaults=True,
        summary="Push one rank's report: the steps it completed since its last report, and where it is now.",
        description=(
            "Body: the rank's fields once, `steps` (oldest first) and `position` (the open step and the phase "
            f"the rank is in; `ended` says goodbye). fleetscope.client sends one at least once a second. "
            f"{all_or_nothing}"
        ),
        openapi_extra=report_body_schema(),
        responses=push_responses,
    )
    async def push_report(request: Request) -> Any:
        return await push(request, lambda body: [parse_report(body)])

    @router.delete(
        "/api/v1/jobs/{job}",
        response_model=JobEndResult,
        summary="End a job: drop the series of all its ranks at once.",
        description="Refused (409) while a rank of the job has a live process, unless the request carries the "
                    "lease of one of the job's ranks in a `Fleetscope-Lease` header.",
        responses={401: ERROR_RESPONSES[401], **_error(409, "rank 0 of job 'j' belongs to a live process, and this "
                                                        "push does not carry its lease", "A live rank's lease.")},
    )
    def end_job(job: str, request: Request) -> Any:
        try:
            require_token(request)
            try:
                removed = store.end_job(job, request.headers.get(LEASE_HEADER))
            except LeaseHeld as exc:
                raise PushRefused(409, "lease", str(exc)) from None
        except PushRefused as exc:
            return refused(exc)
        return JobEndResult(job=job, ranks_removed=removed)

    async def push_group(request: Request, grouping: str, replace_all: bool) -> Response:
        try:
            require_token(request)
            try:
                key = parse_group_path(grouping)
            except GroupError as exc:
                raise PushRefused(400, "invalid", str(exc)) from None
            content_type = request.headers.get("content-type", "text/plain")
            if "protobuf" in content_type:
                raise PushRefused(415, "invalid", "only the text exposition format is accepted, not protobuf")
            async with inflight.hold(request, config.max_body_bytes):
                body = await read_bounded(request, config.max_body_bytes)

                def store_group() -> None:
                    try:
                        families = parse_exposition(body.decode("utf-8", "replace"), key, config.max_group_samples)
                        groups.push(key, families, replace_all)
                    except GroupError as exc:
                        raise PushRefused(400, exc.reason, str(exc)) from None
                    except GroupTooLarge as exc:
                        raise PushRefused(413, "too_large", _naming_setting(exc)) from None
                    except GroupLimitExceeded as exc:
                        retry = {"Retry-After": str(LIMIT_RETRY_AFTER)}
                        raise PushRefused(429, "limit", _naming_setting(exc), headers=retry) from None

                await _maybe_offload(len(body), store_group)
        except PushRefused as exc:
            return refused(exc)
        return Response(status_code=200)

    group_doc = (
        "Pushgateway-compatible group `/metrics/job/<job>{/<label>/<value>}` (text exposition format)."
    )

    @router.put(
        "/metrics/{grouping:path}",
        summary="Replace a Pushgateway-style group.",
        description=group_doc,
        responses={**ERROR_RESPONSES, 400: {"description": "Invalid grouping key or body."}},
    )
    async def put_group(grouping: str, request: Request) -> Response:
        return await push_group(request, grouping, replace_all=True)

    @router.post(
        "/metrics/{grouping:path}",
        summary="Replace the pushed families within a group.",
        description=group_doc,
        responses={**ERROR_RESPONSES, 400: {"description": "Invalid grouping key or body."}},
    )
    async def post_group(grouping: str, request: Request) -> Response:
        return await push_group(request, grouping, replace_all=False)

    @router.delete(
        "/metrics/{grouping:path}",
        summary="Delete a Pushgateway-style group.",
        status_code=202,
        responses={401: ERROR_RESPONSES[401], 400: {"description": "Invalid grouping key."}},
    )
    def delete_group(grouping: str, request: Request) -> Response:
        try:
            require_token(request)
            try:
                key = parse_group_path(grouping)
            except GroupError as exc:
                raise PushRefused(400, "invalid", str(exc)) from None
        except PushRefused as exc:
            return refused(exc)
        groups.delete(key)
        return Response(status_code=202)

    return router
