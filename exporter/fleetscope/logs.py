"""Log lines for every fleetscope command: one handler on the root logger, logfmt or JSON.

Modules only ever call ``logging.getLogger(__name__)``; a command sets this up
once from its :class:`~fleetscope.config.LogConfig` (``--log.level``,
``--log.format``: node_exporter's flags)::

    time=2026-08-01T12:00:00.123456Z level=error logger=fleetscope.engine msg="collector gpu timed out after 8.0s"

Records of libraries (uvicorn, httpx) take the same path, and a line that
repeats in a flood is rate-limited (:mod:`fleetscope.logfilter`). Fields passed as
``extra={...}`` become keys of their own; a logged exception becomes
``exception``. Rendering is structlog's, over the standard ``logging`` records.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import EventDict, WrappedLogger

from fleetscope.config import LogConfig, LogFormat
from fleetscope.logfilter import RepeatFilter

# Always first, in this order; any other field follows.
KEY_ORDER = ("time", "level", "logger", "msg")


# Extras some libraries attach for their own console: uvicorn's message with terminal colour codes.
DROPPED = frozenset({"color_message"})


def _key_order(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    ordered = {key: event[key] for key in KEY_ORDER if key in event}
    return {**ordered, **{key: value for key, value in event.items() if key not in DROPPED}}


def formatter(fmt: LogFormat) -> logging.Formatter:
    """A formatter rendering standard ``logging`` records as one logfmt or JSON line."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.processors.LogfmtRenderer()
    )
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.EventRenamer("msg"),
            _key_order,
            renderer,
        ],
    )


def setup_logging(log: LogConfig, stream: TextIO | None = None, *, quiet: bool = False) -> None:
    """Send every record at ``log.level`` or above to ``stream`` (stderr), replacing any handler set before.

    ``quiet`` is for one-shot commands whose answer goes to stdout (``check``, ``capture``): the default
    level ``info`` becomes ``warning``; a level asked for explicitly stays.
    """
    level = "warning" if quiet and log.level == "info" else log.level
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(RepeatFilter())  # a flood of one failure must not fill the journal
    handler.setFormatter(formatter(log.format))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # A library that installed its own console handler (uvicorn does, unless told not to) would print its
    # records a second time, in its own format: they go through the one handler instead, at the one level
    # (uvicorn also sets its loggers' level from its own log_level, which outlives an earlier server).
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and logger.handlers:
            for old in logger.handlers[:]:
                logger.removeHandler(old)
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
