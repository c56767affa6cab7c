"""Wiring: build the enabled collectors from a :class:`Config`, start the engine, serve HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI
from prometheus_client.registry import Collector as PrometheusCollector

from fleetscope.collectors import REGISTRY, CollectorEntry
from fleetscope.collectors.http import HttpCollector
from fleetscope.collectors.protocol import Collector, HasRouters, collector_class
from fleetscope.config import Config, split_address
from fleetscope.serve.app import create_app, create_push_app
from fleetscope.serve.engine import IDLE_AFTER, CollectorRunner, Engine, LiveCollector
from fleetscope.serve.listeners import ListenerLimits, ListenerStats, fit_to_open_files, raise_open_files_limit
from fleetscope.serve.webconfig import BasicAuth, WebConfig

if TYPE_CHECKING:
    import uvicorn

logger = logging.getLogger(__name__)


def build_collectors(config: Config, registry: Mapping[str, CollectorEntry] = REGISTRY) -> dict[str, Collector]:
    """Instantiate every enabled collector; one that cannot be built is logged and left out."""
    built: dict[str, Collector] = {}
    for name in config.enabled_collectors():
        entry = registry[name]
        try:
            built[name] = collector_class(entry)(config)
        except Exception as exc:
            logger.error("collector %s could not start: %s", name, exc)
    return built


def build_engine(
    config: Config,
    collectors: Mapping[str, Collector],
    registry: Mapping[str, CollectorEntry] = REGISTRY,
    process: PrometheusCollector | None = None,
) -> Engine:
    runners: list[CollectorRunner | LiveCollector] = []
    for name, collector in collectors.items():
        settings = config.collector(name)
        if registry[name].live:
            runners.append(LiveCollector(name, collector))
        else:
            pause_after = config.collection.pause_after
            runners.append(CollectorRunner(
                name, collector, settings.interval, settings.timeout, config.staleness_for(name),
                idle_after=pause_after or IDLE_AFTER, pausable=registry[name].pausable and pause_after > 0,
            ))
    return Engine(runners, process)


@dataclass
class Daemon:
    config: Config
    collectors: dict[str, Collector]
    engine: Engine
    app: FastAPI
    push_app: FastAPI | None = None
    web: WebConfig | None = None  # web.config.file: TLS and basic auth on every listener
    servers: list[uvicorn.Server] = field(default_factory=list)

    async def serve(self) -> None:
        import uvicorn  # lazy: `fleetscope check` never needs a server

        from fleetscope.serve.guard import uvicorn_config

        self.engine.start()
        apps = [("main", self.app, self.config.web.listen_address)]
        if self.push_app is not None:
            apps.append(("push", self.push_app, self.config.push.listen_address))
        open_files = raise_open_files_limit()
        for name, app, address in apps:
            stats = self.listener_stats(name)
            stats.limits = fit_to_open_files(stats.limits, len(apps), open_files)
            uv_config = uvicorn_config(app, split_address(address), stats, self.config.log.level)
            context = self.web.listener_context() if self.web is not None else None
            if context is not None:
                uv_config.load()  # what Server.serve would do first; then the listener serves TLS only
                uv_config.ssl = context
            self.servers.append(uvicorn.Server(uv_config))
        try:
            await asyncio.gather(*(server.serve() for server in self.servers), self._announce([n for n, _, _ in apps]))
        finally:
            self.engine.stop()

    async def _announce(self, names: list[str]) -> None:
        """Once every listener is open: log the address each bound (port 0: the kernel's choice) and write them to
        ``web.ready-file``, written whole (a reader never sees half of it)."""
        while not all(server.started for server in self.servers):
            await asyncio.sleep(0.02)  # uvicorn sets ``started`` once it listens; a failed bind exits the process
        bound = {name: bound_address(server) for name, server in zip(names, self.servers, strict=True)}
        logger.info("listening on %s", ", ".join(f"{address} ({name})" for name, address in bound.items()))
        path = self.config.web.ready_file
        if path:
            partial = f"{path}.{os.getpid()}.tmp"
            with open(partial, "w", encoding="utf-8") as out:
                json.dump(bound, out)
            os.replace(partial, path)

    def listener_stats(self, name: str) -> ListenerStats:
        """Counts for listener ``name``: the ``http`` collector's, exported; private ones when it is off."""
        http = self.collectors.get("http")
        if isinstance(http, HttpCollector):
            return http.listener(name)
        web = self.config.web
        return ListenerStats(name, ListenerLimits(web.max_connections, web.read_header_timeout, web.read_timeout))

    def request_stop(self) -> None:
        for server in self.servers:
            server.should_exit = True


def bound_address(server: uvicorn.Server) -> str:
    """``host:port`` (``[v6]:port``) of a started uvicorn server's first socket: the port it really bound."""
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def build_daemon(
    config: Config,
    registry: Mapping[str, CollectorEntry] = REGISTRY,
    collectors: Mapping[str, Collector] | None = None,
    process: PrometheusCollector | None = None,
) -> Daemon:
    """The daemon; ``process`` adds the serving process's own metrics (``fleetscope serve`` passes
    prometheus_client's ProcessCollector; in-process tests leave them out, as their values are the test's)."""
    built = dict(collectors) if collectors is not None else build_collectors(config, registry)
    engine = build_engine(config, built, registry, process)
    main_routers: list[APIRouter] = []
    push_routers: list[APIRouter] = []
    for collector in built.values():
        if not isinstance(collector, HasRouters):
            continue
        for where, router in collector.routers():
            (push_routers if where == "push" else main_routers).append(router)
    separate_push = bool(config.push.listen_address)
    app = create_app(engine, config.web.telemetry_path, main_routers + ([] if separate_push else push_routers),
                     api_docs=config.web.api_docs)
    push_app = create_push_app(push_routers, config.web.api_docs) if separate_push and push_routers else None
    web = WebConfig(config.web.config_file) if config.web.config_file else None
    if web is not None:
        for each in (app, push_app):
            if each is not None:
                each.add_middleware(BasicAuth, web=web)
    return Daemon(config, built, engine, app, push_app, web)
