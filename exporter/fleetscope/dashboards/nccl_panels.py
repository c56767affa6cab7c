"""The job dashboard's NCCL row: per-rank collective time and bus bandwidth from the NCCL Inspector.

A row of its own, so the job dashboard adds it with one line. It reads the
recording rules of ``rules/nccl.py`` (the ratio the NcclLateRank alert judges)
and the Inspector's counters for the bus bandwidth each rank sees.
"""

from __future__ import annotations

from typing import Any

from fleetscope.dashboards.kit import Q, falling, ok, timeseries_panel
from fleetscope.metrics import nccl
from fleetscope.promql import NCCL_RANK_RATIO
from fleetscope.rules.settings import PRODUCTION


def nccl_row(matchers: str, rate: str) -> list[Any]:
    """Panels for the ranks selected by ``matchers`` (label matchers), counters rated over ``rate``."""
    seconds = f"rate({nccl.COLLECTIVE_SECONDS_TOTAL}{{{matchers}}}{rate})"
    bus_bytes = f"rate({nccl.COLLECTIVE_BUS_BYTES_TOTAL}{{{matchers}}}{rate})"
    late = PRODUCTION.nccl_late_ratio
    return [
        timeseries_panel(
            "NCCL collective time vs communicator median, per rank (lowest 10)", "percentunit",
            falling(late, 0.9), Q(f"bottomk(10, max by (rank) ({NCCL_RANK_RATIO}{{{matchers}}}))", "rank {{rank}}"),
            minimum=0,
            description="Each rank's time in its collectives over what the median rank of the same communicator "
                        "spends on the same collectives (NCCL Inspector). The rank that arrives last waits least: "
                        f"a rank persistently below {late:.0%} in every communicator holds the others up "
                        "(NcclLateRank)."),
        timeseries_panel(
            "NCCL bus bandwidth per rank", "Bps", ok(),
            Q(f"sum by (rank) ({bus_bytes}) / sum by (rank) ({seconds} > 0)", "rank {{rank}}"),
            minimum=0,
            description="Time-weighted bus bandwidth of each rank's collectives, as the Inspector computes it. "
                        "Ranks that wait for a late peer show less; the late rank shows what the fabric delivers."),
    ]
