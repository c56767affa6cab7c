"""Errors the daemon distinguishes.

    FleetscopeError
    ├── NoHardware       the source's hardware is absent here (not a failure; logged at debug)
    └── SourceError      a source could not be read (the collector reports failure)

Configuration errors are :class:`fleetscope.config.ConfigError`.
"""

from __future__ import annotations


class FleetscopeError(Exception):
    pass


class NoHardware(FleetscopeError):
    """Raised by a source or collector when the hardware it reads is not on this node."""


class SourceError(FleetscopeError):
    """Raised when a source fails as a whole (a single unreadable value is skipped, not raised)."""
