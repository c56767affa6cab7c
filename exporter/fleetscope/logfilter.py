"""Rate-limit repeated log lines, so a flood of one failure cannot fill the disk.

A client flood can make the same line repeat thousands of times a second
(asyncio's "socket.accept() out of system resource" with its traceback,
uvicorn's "Invalid HTTP request received."). :class:`RepeatFilter` lets the
first ``burst`` records of one kind (logger, level and message template,
not the formatted arguments) through per ``window`` seconds, drops the rest,
and notes how many it dropped on the next one it lets through.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_KINDS = 1024  # kinds remembered; the least recently seen is forgotten first


class RepeatFilter(logging.Filter):
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
