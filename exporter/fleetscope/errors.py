"""Errors the daemon distinguishes.

    FleetscopeError
    ├── NoHardware       the source's hardware is absent here (not a failure; logged at debug)
    └── SourceError      a source could not be read (the collector reports failure)
        └── Incomplete   part of it could not be read: what could is served, the collector reports failure

Configuration errors are :class:`fleetscope.config.ConfigError`.
"""

from __future__ import annotations

from typing import Any


class FleetscopeError(Exception):
    pass


class NoHardware(FleetscopeError):
    """Raised by a source or collector when the hardware it reads is not on this node."""


class SourceError(FleetscopeError):
    """Raised when a source fails as a whole (a single unreadable value is skipped, not raised)."""


class Incomplete(SourceError):
    """Raised by a collector whose source answered only in part (one device of eight, one file of two).

    ``metrics`` holds the families built from what could be read: they are served as a fresh reading,
    while ``fleetscope_collector_success`` reads 0, so a blind spot is never a quiet success.
    """

    def __init__(self, message: str, metrics: list[Any]) -> None:
        super().__init__(message)
        self.metrics = metrics
