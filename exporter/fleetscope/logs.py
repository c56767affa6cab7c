"""Log lines for every fleetscope command: one handler on the root logger, logfmt or JSON.

Modules only ever call ``logging.getLogger(__name__)``; a command sets this up
once from its :class:`~fleetscope.config.LogConfig` (``--log.level``,
``--log.format``: node_exporter's flags)::

    time=2026-08-01T12:00:00.123456Z level=error logger=fleetscope.serve.engine msg="collector gpu timed out after 8.0s"

Records of libraries (uvicorn, httpx) take the same path, and a line that
repeats in a flood is rate-limited (:class:`RepeatFilter`). Fields passed as
``extra={...}`` become keys of their own; a logged exception becomes
``exception``. Rendering is structlog's, over the standard ``logging`` records.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TextIO

import structlog
from structlog.typing import EventDict, WrappedLogger

from fleetscope.config import LogConfig, LogFormat

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


MAX_KINDS = 1024  # kinds of repeated line a RepeatFilter remembers; the least recently seen is forgotten first


class RepeatFilter(logging.Filter):
    """Rate-limit repeated log lines, so a flood of one failure cannot fill the disk.

    A client flood can make the same line repeat thousands of times a second
    (asyncio's "socket.accept() out of system resource" with its traceback,
    uvicorn's "Invalid HTTP request received."). This filter lets the
    first ``burst`` records of one kind (logger, level and message template,
    not the formatted arguments) through per ``window`` seconds, drops the rest,
    and notes how many it dropped on the next one it lets through.
    """

    def __init__(self, burst: int = 5, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        # kind -> [window start, records let through in it, records dropped since the last one let through]
        self._kinds: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        with self._lock:
            state = self._kinds.get(kind)
            if state is None:
                state = self._kinds[kind] = [now, 0, 0]
                if len(self._kinds) > MAX_KINDS:
                    self._kinds.popitem(last=False)
            else:
                self._kinds.move_to_end(kind)
            if now - state[0] >= self.window:
                state[0], state[1] = now, 0
            if state[1] >= self.burst:
                state[2] += 1
                return False
            state[1] += 1
            dropped, state[2] = int(state[2]), 0
        if dropped:
            record.msg = f"{record.msg} [{dropped} more like this dropped]"
        return True
