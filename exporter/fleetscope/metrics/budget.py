"""The series budget of one node: what a p5.48xlarge costs per collector and detail level.

The figures are counted, not estimated: ``tests/test_series_budget.py`` scrapes
a simulated p5 node at both levels and fails when they differ from these, so
the catalog (``docs/metrics.md``), which prints them, stays true.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from fleetscope.metrics.spec import DetailLevel

# The default level's ceiling per p5 node, Prometheus's own per-target series included: 12,500 nodes
# (100,000 GPUs) then stay within 12.5M active series.
BUDGET = 1000

P5_NODE = (
    "p5.48xlarge: 8 H100 GPUs (NVML with GPM), 32 EFA devices, 4 ENA interfaces, 8 ranks of one job "
    "pushing steps and their positions (the client's reports), their processes alive; "
    "no Xid, no Slurm job record, no NCCL Inspector output"
)

# Series Prometheus adds to every target: up, scrape_duration_seconds, scrape_samples_scraped,
# scrape_samples_post_metric_relabeling, scrape_series_added.
PROMETHEUS_PER_TARGET = 5

# Series per collector on that node ("engine": the daemon's reports on its collectors and build).
P5_SERIES: Mapping[str, Mapping[DetailLevel, int]] = MappingProxyType({
    "efa": MappingProxyType({"default": 69, "all": 1154}),
    "gpu": MappingProxyType({"default": 460, "all": 1068}),
    "steps": MappingProxyType({"default": 225, "all": 225}),
    "netdev": MappingProxyType({"default": 56, "all": 56}),
    "ena": MappingProxyType({"default": 40, "all": 40}),
    "engine": MappingProxyType({"default": 33, "all": 33}),
    "netstat": MappingProxyType({"default": 10, "all": 10}),
})


def p5_total(level: DetailLevel) -> int:
    """Every series one p5 node costs at ``level``, Prometheus's per-target ones included."""
    return sum(counts[level] for counts in P5_SERIES.values()) + PROMETHEUS_PER_TARGET
