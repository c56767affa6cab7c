"""Wiring: build the enabled collectors from a :class:`Config`, start the engine, serve HTTP."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from fastapi import APIRouter, FastAPI

from fleetscope.collectors import REGISTRY, CollectorEntry
from fleetscope.config import Config, split_address
from fleetscope.engine import CollectorRunner, Engine, LiveCollector
from fleetscope.http import create_app, create_push_app

logger = logging.getLogger("fleetscope.daemon")


def build_collectors(config: Config, registry: Mapping[str, CollectorEntry] = REGISTRY) -> dict[str, Any]:
    """Instantiate every enabled collector; one that cannot be built is logged and left out."""
    built: dict[str, Any] = {}
    for name in config.enabled_collectors():
        entry = registry[name]
        try:
            built[name] = entry.load()(config)
        except Exception as exc:
            logger.error("collector %s could not start: %s", name, exc)
    return built


def build_engine(config: Config, collectors: Mapping[str, Any], registry: Mapping[str, CollectorEntry] = REGISTRY) -> Engine:
    runners: list[CollectorRunner | LiveCollector] = []
    for name, collector in collectors.items():
        settings = config.collector(name)
        if registry[name].live:
            runners.append(LiveCollector(name, collector))
        else:
            runners.append(CollectorRunner(name, collector, settings.interval, settings.timeout,
                                           config.staleness_for(name), pausable=registry[name].pausable))
    return Engine(runners)


@dataclass
class Daemon:
    config: Config
    collectors: dict[str, Any]
    engine: Engine
    app: FastAPI
    push_app: FastAPI | None = None
    servers: list[Any] = field(default_factory=list)

    async def serve(self) -> None:
        import uvicorn  # lazy: `fleetscope check` never needs a server

        self.engine.start()
        apps = [(self.app, self.config.web.listen_address)]
        if self.push_app is not None:
            apps.append((self.push_app, self.config.push.listen_address))
        for app, address in apps:
            host, port = split_address(address)
            uv_config = uvicorn.Config(
                app, host=host, port=port, log_level=self.config.log.level, access_log=False, lifespan="off",
                workers=1,
            )
            self.servers.append(uvicorn.Server(uv_config))
        try:
            await asyncio.gather(*(server.serve() for server in self.servers))
        finally:
            self.engine.stop()

    def request_stop(self) -> None:
        for server in self.servers:
            server.should_exit = True


def build_daemon(config: Config, registry: Mapping[str, CollectorEntry] = REGISTRY, collectors: Mapping[str, Any] | None = None) -> Daemon:
    built = dict(collectors) if collectors is not None else build_collectors(config, registry)
    engine = build_engine(config, built, registry)
    main_routers: list[APIRouter] = []
    push_routers: list[APIRouter] = []
    for collector in built.values():
        routers = getattr(collector, "routers", None)
        if routers is None:
            continue
        for where, router in routers():
            (push_routers if where == "push" else main_routers).append(router)
    separate_push = bool(config.push.listen_address)
    app = create_app(engine, config.web.telemetry_path, main_routers + ([] if separate_push else push_routers))
    push_app = create_push_app(push_routers) if separate_push and push_routers else None
    return Daemon(config, built, engine, app, push_app)
