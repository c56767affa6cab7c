"""The HTTP side: a FastAPI app for /metrics, health probes and collector routes.

``/metrics`` is a plain ``def`` route, so FastAPI runs it in its threadpool:
rendering the exposition never blocks the event loop (and with it, pushes).
It only reads the engine's latest readings, which never wait on hardware.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from fleetscope import __version__
from fleetscope.engine import Engine


def make_registry(engine: Engine) -> CollectorRegistry:
    """A registry over the engine, for tests and tools (``/metrics`` renders through the engine's cache)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(engine)  # type: ignore[arg-type]
    return registry


def create_app(
    engine: Engine,
    telemetry_path: str = "/metrics",
    routers: Iterable[APIRouter] = (),
) -> FastAPI:
    app = FastAPI(
        title="fleetscope",
        version=__version__,
        description="Per-node daemon of fleetscope: GPU, EFA and network metrics, and training-step pushes.",
    )
    app.add_middleware(GZipMiddleware, minimum_size=1024)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def landing() -> str:
        names = "".join(f"<li>{r.name}</li>" for r in engine.runners)
        return (
            "<html><head><title>fleetscope</title></head><body><h1>fleetscope</h1>"
            f"<p>version {__version__}</p>"
            f'<p><a href="{telemetry_path}">Metrics</a> · <a href="/healthz">healthz</a> · '
            '<a href="/readyz">readyz</a> · <a href="/docs">API docs</a></p>'
            f"<p>Collectors:</p><ul>{names}</ul></body></html>"
        )

    @app.get(telemetry_path, include_in_schema=False)
    def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(engine.render(encoder, content_type), media_type=content_type)

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


def create_push_app(routers: Iterable[APIRouter]) -> FastAPI:
    """The app for a separate push address: only push routes and a liveness probe."""
    app = FastAPI(title="fleetscope push API", version=__version__)

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> str:
        return "ok\n"

    for router in routers:
        app.include_router(router)
    return app
