"""The HTTP side: a FastAPI app for /metrics, health probes and collector routes.

``/metrics`` negotiates the format and gzip itself and serves the engine's
pre-rendered bytes (:mod:`fleetscope.serve.exposition`) straight from the event loop;
only a scrape that has to render a background reading (a format nobody asked
for before) or wait for a paused collector goes to the threadpool, so pushes
are never held up behind it. The GZip middleware, which would compress the body
again on every scrape, only handles the other routes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict

from fastapi import APIRouter, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetscope import __version__
from fleetscope.serve.engine import Engine
from fleetscope.serve.exposition import accepts_gzip, negotiate


class GZipExcept:
    """Starlette's GZip middleware for every path but one, which negotiates its own encoding.

    The middleware would compress ``/metrics`` again on every scrape, and it
    reads ``gzip;q=0`` as a yes.
    """

    def __init__(self, app: ASGIApp, path: str, minimum_size: int = 1024) -> None:
        self.app = app
        self.path = path
        self.gzip = GZipMiddleware(app, minimum_size=minimum_size)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == self.path:
            await self.app(scope, receive, send)
        else:
            await self.gzip(scope, receive, send)


class _DocsUrls(TypedDict):
    openapi_url: str | None
    docs_url: str | None
    redoc_url: str | None


def _docs_urls(api_docs: bool) -> _DocsUrls:
    """FastAPI's documentation routes, only with web.api-docs (they are not behind the push token)."""
    if api_docs:
        return {"openapi_url": "/openapi.json", "docs_url": "/docs", "redoc_url": "/redoc"}
    return {"openapi_url": None, "docs_url": None, "redoc_url": None}


def create_app(
    engine: Engine,
    telemetry_path: str = "/metrics",
    routers: Iterable[APIRouter] = (),
    api_docs: bool = False,
) -> FastAPI:
    app = FastAPI(
        title="fleetscope",
        version=__version__,
        description="Per-node daemon of fleetscope: GPU, EFA and network metrics, and training-step pushes.",
        **_docs_urls(api_docs),
    )
    app.add_middleware(GZipExcept, path=telemetry_path)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def landing() -> str:
        names = "".join(f"<li>{r.name}</li>" for r in engine.runners)
        docs = ' · <a href="/docs">API docs</a>' if api_docs else ""
        return (
            "<html><head><title>fleetscope</title></head><body><h1>fleetscope</h1>"
            f"<p>version {__version__}</p>"
            f'<p><a href="{telemetry_path}">Metrics</a> · <a href="/healthz">healthz</a> · '
            f'<a href="/readyz">readyz</a>{docs}</p>'
            f"<p>Collectors:</p><ul>{names}</ul></body></html>"
        )

    @app.get(telemetry_path, include_in_schema=False)
    async def metrics(request: Request) -> Response:
        fmt = negotiate(request.headers.get("accept"))
        compressed = accepts_gzip(request.headers.get("accept-encoding"))
        body = engine.exposition(fmt, compressed, block=False)
        if body is None:
            body = await run_in_threadpool(engine.exposition, fmt, compressed)
        headers = {"Vary": "Accept, Accept-Encoding"}
        if compressed:
            headers["Content-Encoding"] = "gzip"
        return Response(body, media_type=fmt.content_type, headers=headers)

    @app.get("/healthz", response_class=PlainTextResponse, summary="Liveness: the daemon answers.")
    def healthz() -> str:
        return "ok\n"

    @app.get("/readyz", response_class=PlainTextResponse, summary="Readiness: every collector has run once.")
    def readyz() -> Response:
        if engine.ready():
            return PlainTextResponse("ready\n")
        return PlainTextResponse("collectors have not finished their first run\n", status_code=503)

    for router in routers:
        app.include_router(router)
    return app


def create_push_app(routers: Iterable[APIRouter], api_docs: bool = False) -> FastAPI:
    """The app for a separate push address: only push routes and a liveness probe."""
    app = FastAPI(title="fleetscope push API", version=__version__, **_docs_urls(api_docs))

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> str:
        return "ok\n"

    for router in routers:
        app.include_router(router)
    return app
