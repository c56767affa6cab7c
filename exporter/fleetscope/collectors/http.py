"""The ``http`` collector: the daemon's own HTTP listeners (connections held and dropped).

It owns the per-listener counts; the daemon hands them to the servers it
starts (:mod:`fleetscope.serve.guard`), which count into them. A live collector:
read at scrape time.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from fleetscope.collectors.protocol import Collector
from fleetscope.config import Config
from fleetscope.metrics import http
from fleetscope.metrics.families import FamilyBuilder
from fleetscope.serve.listeners import ListenerLimits, ListenerStats


class HttpCollector(Collector):
    name = "http"
    tables = (http.TABLE,)

    def __init__(self, config: Config) -> None:
        self.config = config
        self.listeners: dict[str, ListenerStats] = {}

    def listener(self, name: str) -> ListenerStats:
        """The counts of listener ``name`` ("main" or "push"), created on first use."""
        stats = self.listeners.get(name)
        if stats is None:
            web = self.config.web
            limits = ListenerLimits(web.max_connections, web.read_header_timeout, web.read_timeout)
            stats = self.listeners[name] = ListenerStats(name, limits)
        return stats

    def collect(self) -> list[Metric]:
        builder = FamilyBuilder()
        for name, stats in sorted(self.listeners.items()):
            builder.add(http.CONNECTIONS, (name,), stats.open)
            builder.add(http.MAX_CONNECTIONS, (name,), stats.limits.max_connections)
            for reason, count in stats.dropped().items():
                builder.add(http.CONNECTIONS_DROPPED_TOTAL, (name, reason), count)
        return builder.families()
