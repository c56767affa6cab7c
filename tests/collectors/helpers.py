"""Shared by the collector tests: look at families the way a scrape does."""

from __future__ import annotations

from prometheus_client import CollectorRegistry


class Families:
    """A fixed list of families, registered as a collector."""

    def __init__(self, metrics: list) -> None:
        self.metrics = metrics

    def collect(self) -> list:
        return self.metrics


def registry_of(metrics: list) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(metrics))  # type: ignore[arg-type]
    return registry
