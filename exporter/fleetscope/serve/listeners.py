"""Per-listener HTTP limits and counts, without the server: the ``http`` collector and ``check`` import this.

The enforcement is :mod:`fleetscope.serve.guard` (uvicorn's h11 protocol with
deadlines and a connection cap); this module holds what it is configured with,
what it counts, and how many connections the open-files limit leaves.
"""

from __future__ import annotations

import logging
import resource
import threading
from dataclasses import dataclass, replace

logger = logging.getLogger(__name__)

# File descriptors kept back from the connection budget: sysfs and procfs reads, NVML, the kernel log,
# log files, the event loop's own.
RESERVED_FDS = 128
# The listen backlog is also how many connections asyncio accepts in one go, before any of them is
# counted against the cap; a few such bursts can be in flight at once, so they come off the budget too.
# It scales with the open files limit: 2048 (uvicorn's default) when there is room, 64 at least.
MIN_BACKLOG, MAX_BACKLOG = 64, 2048
ACCEPT_BURSTS = 4
MIN_CONNECTIONS = 16
DROP_REASONS = ("read_header_timeout", "read_timeout", "evicted", "over_limit")


@dataclass(frozen=True)
class ListenerLimits:
    max_connections: int
    read_header_timeout: float
    read_timeout: float
    backlog: int = MAX_BACKLOG


class ListenerStats:
    """Counts for one listener: open connections and connections dropped, by reason."""

    def __init__(self, name: str, limits: ListenerLimits) -> None:
        # ``limits`` is replaced at start, once the open files limit is known.
        self.name = name
        self.limits = limits
        self._lock = threading.Lock()
        self.open = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)

    def opened(self, change: int) -> None:
        with self._lock:
            self.open += change

    def drop(self, reason: str) -> None:
        with self._lock:
            self._dropped[reason] += 1

    def dropped(self) -> dict[str, int]:
        with self._lock:
            return dict(self._dropped)


def raise_open_files_limit() -> int:
    """Raise the soft open-files limit to the hard one (as Go programs do at start); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft and (hard == resource.RLIM_INFINITY or hard > soft):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
    return soft


def fit_to_open_files(limits: ListenerLimits, listeners: int, open_files: int) -> ListenerLimits:
    """``limits`` with the backlog and connection cap one of ``listeners`` listeners can afford."""
    listeners = max(1, listeners)
    room = max(0, open_files - RESERVED_FDS) // listeners
    backlog = min(MAX_BACKLOG, max(MIN_BACKLOG, room // (2 * ACCEPT_BURSTS)))
    share = max(MIN_CONNECTIONS, room - ACCEPT_BURSTS * backlog)
    configured = limits.max_connections
    if configured > share:
        logger.warning(
            "web.max-connections=%d is above what the open files limit (%d) leaves each of %d listener(s); "
            "using %d (raise LimitNOFILE / ulimit -n)", configured, open_files, listeners, share)
    cap = share if configured <= 0 else min(configured, share)
    return replace(limits, max_connections=cap, backlog=backlog)
