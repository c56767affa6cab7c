"""Background delivery of step records: a bounded buffer and one sender thread.

The training thread only appends to the buffer (a lock held for a deque
operation). When the buffer is full the oldest record is dropped and counted.
The sender thread posts batches with the standard library; on failure the
batch goes back to the front of the buffer (still subject to the bound) and
the thread backs off exponentially with jitter. Records the daemon refuses
as invalid (4xx other than 429) are dropped and counted instead of retried.
Nothing here raises into the caller.

With the rank's fields given (as :class:`~fleetscope.client.StepTracker`
does), the thread sends one report per flush interval to ``/api/v1/report``:
the rank's fields once, the steps buffered since the last report, and the
rank's position, read from the tracker at send time. So the report doubles as
a heartbeat of the process: it goes out every interval while the process
lives, whatever the training thread is doing. The last report, when the
sender closes (``tracker.close()`` or interpreter exit), says ``ended``. A
daemon without that route (404: an older fleetscope) gets flat records on
``/api/v1/steps`` instead, without positions.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import logging
import os
import random
import socket
import threading
import time
import urllib.parse
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

STEPS_PATH = "/api/v1/steps"
REPORT_PATH = "/api/v1/report"
ENDED = "ended"


@dataclass(frozen=True)
class SenderStats:
    enqueued: int  # records handed to the buffer
    sent: int  # records the daemon accepted
    dropped: int  # records pushed out of the full buffer (oldest first)
    rejected: int  # records the daemon refused as invalid
    pending: int  # records in the buffer or in flight
    failures: int  # failed delivery attempts
    error: str | None = None  # the last error retrying cannot fix (a token no header can carry, a refused token)


class RecordBuffer:
    """A FIFO of at most ``capacity`` records that drops the oldest on overflow.

    It also keeps the delivery accounting (in flight, sent, rejected) under
    its one lock, so a stats snapshot always adds up: every record ever put is
    pending, sent, rejected or dropped.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._lock = threading.Lock()
        self._items: deque[dict[str, Any]] = deque()
        self.enqueued = 0
        self.dropped = 0
        self.in_flight = 0
        self.sent = 0
        self.rejected = 0

    def put(self, record: dict[str, Any]) -> int:
        with self._lock:
            if len(self._items) >= self.capacity:
                self._items.popleft()
                self.dropped += 1
            self._items.append(record)
            self.enqueued += 1
            return len(self._items)

    def take(self, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            count = min(limit, len(self._items))
            self.in_flight += count
            return [self._items.popleft() for _ in range(count)]

    def settle(self, batch: list[dict[str, Any]], delivered: bool) -> None:
        """A taken batch is done: stored by the daemon, or refused for good."""
        with self._lock:
            self.in_flight -= len(batch)
            if delivered:
                self.sent += len(batch)
            else:
                self.rejected += len(batch)

    def give_back(self, batch: list[dict[str, Any]]) -> None:
        """Return an undelivered batch to the front; if that overflows, its oldest records go."""
        with self._lock:
            self.in_flight -= len(batch)
            room = self.capacity - len(self._items)
            if room < len(batch):
                overflow = len(batch) - max(room, 0)
                self.dropped += overflow
                batch = batch[overflow:]
            self._items.extendleft(reversed(batch))

    def stats(self, failures: int, error: str | None = None) -> SenderStats:
        with self._lock:
            return SenderStats(
                enqueued=self.enqueued,
                sent=self.sent,
                dropped=self.dropped,
                rejected=self.rejected,
                pending=len(self._items) + self.in_flight,
                failures=failures,
                error=error,
            )

    def __len__(self) -> int:
        return len(self._items)


class Sender:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        batch_size: int = 256,
        capacity: int = 10_000,
        flush_interval: float = 1.0,
        timeout: float = 2.0,
        max_backoff: float = 30.0,
        rank_fields: Mapping[str, Any] | None = None,
        position: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        self.url = url
        # As people write it to a file or a variable: surrounding whitespace (echo's newline) is no part of it,
        # and an empty one is none (the daemon trims both ends alike).
        self.token = (token.strip() or None) if token is not None else None
        self.error: str | None = None
        # Reports (steps + position) when the rank's fields are known; flat records otherwise.
        self.rank_fields = dict(rank_fields) if rank_fields is not None else None
        self.position = position
        self.reports = rank_fields is not None
        self.batch_size = max(1, batch_size)
        self.flush_interval = flush_interval
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.buffer = RecordBuffer(capacity)
        self.failures = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._warned = False
        # One kept-alive connection to the daemon: a new connection per push costs the daemon more
        # than twice the CPU of the push itself (benchmarks). http.client also ignores HTTP_PROXY,
        # which must not capture pushes to a daemon on this node.
        parts = urllib.parse.urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port
        self._base = parts.path
        self._connection: http.client.HTTPConnection | None = None
        self._muted = False  # never sends: a forked child, or a process that is not the rank's
        self._abandoned = False
        self._answered = False  # the daemon has stored a push from this process
        self._close_by = 0.0  # monotonic deadline of close(): the last flush retries until then
        _register_cleanup(self)

    # -- training thread side -----------------------------------------------------------------

    def put(self, record: dict[str, Any]) -> None:
        if self._thread is None:
            self._start()
        if self.buffer.put(record) >= self.batch_size:
            self._wake.set()

    def start(self) -> None:
        """Start the thread now (a tracker does: its reports are the rank's heartbeat from the start)."""
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._stop.is_set() and not self._muted:
                self._thread = threading.Thread(target=self._run, name="fleetscope-push", daemon=True)
                self._thread.start()

    def stats(self) -> SenderStats:
        return self.buffer.stats(self.failures, self.error)

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is buffered and stop the thread, waiting at most ``timeout``.

        A daemon that has answered this process before is retried until the deadline (a slow moment on a
        loaded node must not lose the last steps); one never reached gets one attempt, so a job on a node
        without the daemon does not wait ``timeout`` at every exit."""
        self._close_by = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def abandon(self) -> None:
        """Stop at once, sending nothing more (no goodbye, buffered records dropped): as a dying process."""
        self._abandoned = True
        self._stop.set()
        self._wake.set()

    def after_fork(self) -> None:
        """In a forked child (a DataLoader worker): the parent's thread, locks and socket are not ours.

        The child never sends: it is not the rank, and a report from it (its exit's ``ended`` above all)
        would speak for the rank.
        """
        self.buffer = RecordBuffer(self.buffer.capacity)
        self._thread = None
        self._start_lock = threading.Lock()
        self._wake = threading.Event()
        self._connection = None
        self._muted = True

    def silence(self) -> None:
        """Never send (the thread is not started; records put are kept in the bounded buffer, then dropped)."""
        self._muted = True

    # -- sender thread ------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.0
        while True:
            stopping = self._stop.is_set()
            if not stopping:
                if backoff:
                    self._stop.wait(backoff)  # a full buffer must not cut a backoff short
                else:
                    self._wake.wait(self.flush_interval)
                self._wake.clear()
                stopping = self._stop.is_set()
            if self._abandoned:
                self._disconnect()
                return
            heartbeat = self.reports  # every cycle sends one report, steps or not
            while True:
                batch = self.buffer.take(self.batch_size)
                if not batch and not heartbeat:
                    backoff = 0.0
                    break
                outcome = self._deliver(batch, self._position(stopping) if self.reports else None)
                heartbeat = False
                if outcome is None:
                    self.buffer.give_back(batch)
                    self.failures += 1
                    backoff = min(self.max_backoff, max(0.5, backoff * 2)) * random.uniform(0.8, 1.2)
                    if stopping and self._retry_before_close(backoff):
                        heartbeat = bool(self.reports)  # the goodbye is not sent yet
                        continue
                    break
                self.buffer.settle(batch, delivered=outcome)
                backoff = 0.0
                if not batch:
                    break
            if stopping:
                self._disconnect()
                return

    def _retry_before_close(self, backoff: float) -> bool:
        """While closing: wait for the next attempt if the daemon has answered before and close() still has
        time for a push's timeout after the wait."""
        if not self._answered or self._abandoned:
            return False
        wait = min(backoff, 1.0)
        if time.monotonic() + wait + self.timeout > self._close_by:
            return False
        self._wake.clear()
        self._wake.wait(wait)  # abandon() wakes it
        return not self._abandoned

    def _position(self, ending: bool) -> dict[str, Any] | None:
        try:
            position = self.position() if self.position is not None else None
        except Exception as exc:  # the tracker's bug must not stop delivery
            logger.debug("fleetscope: reading the position failed: %r", exc)
            position = None
        if ending and position is not None:
            position = {**position, "phase": ENDED}
        return position

    def _deliver(self, batch: list[dict[str, Any]], position: dict[str, Any] | None) -> bool | None:
        """True: stored. False: refused for good (dropped, counted). None: retry later."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        payload: Any
        if self.reports and self.rank_fields is not None:
            path, payload = REPORT_PATH, {**self.rank_fields, "steps": batch, "position": position}
        else:
            path, payload = STEPS_PATH, self._records(batch)
        try:
            body = json.dumps(payload, allow_nan=True).encode()
        except (TypeError, ValueError) as exc:  # a value json cannot encode: never retry it forever
            logger.warning("fleetscope: dropping %d records that cannot be encoded: %s", len(batch), exc)
            return False
        try:
            status, detail = self._post(self._base + path, body, headers)
        except ValueError as exc:  # http.client refused the request itself (a header, the URL): never retried
            self._permanent(f"the request cannot be sent ({type(exc).__name__}: {exc}); check the push token "
                            f"and URL", len(batch))
            return False
        except Exception as exc:  # connection refused, timeout, DNS: the daemon is down or slow
            self._warn(f"{type(exc).__name__}: {exc}")
            return None
        if status == 404 and self.reports:
            logger.info("fleetscope: %s has no %s (an older daemon): pushing steps without positions",
                        self.url, REPORT_PATH)
            self.reports = False
            return self._deliver(batch, None) if batch else True
        if status < 300:
            self._answered = True
            return True
        if status == 429 or status >= 500:
            self._warn(f"daemon answered {status}")
            return None
        if status == 409:  # another process holds the rank's lease; it lapses when that process ends
            self._warn(f"daemon answered 409: {detail[:200].decode('utf-8', 'replace')}")
            return None
        if status in (401, 403):
            self._permanent(f"the daemon refused the push token ({status})", len(batch))
            return False
        logger.warning("fleetscope: daemon refused %d records (%d): %s", len(batch), status,
                       detail[:300].decode("utf-8", "replace"))
        return False

    def _records(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Flat records: the rank's fields repeated in each step (for /api/v1/steps)."""
        if self.rank_fields is None:
            return batch
        return [{**self.rank_fields, **entry} for entry in batch]

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """POST on the kept-alive connection; a connection the daemon closed while idle is replaced once."""
        for attempt in (1, 2):
            reused = self._connection is not None
            connection = self._connection or self._connect()
            # One deadline over the whole exchange: the socket timeout bounds each read, so a daemon that
            # trickles its answer a byte at a time would otherwise hold delivery without end.
            deadline = threading.Timer(self.timeout, _cut, (connection,))
            deadline.daemon = True
            deadline.start()
            try:
                connection.request("POST", path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._disconnect()
                if reused and attempt == 1:
                    continue  # the daemon dropped an idle connection before reading the request
                raise
            except Exception:
                self._disconnect()
                raise
            finally:
                deadline.cancel()
            if response.will_close:
                self._disconnect()
            return response.status, data
        raise AssertionError("unreachable")

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        self._connection = cls(self._host, self._port, timeout=self.timeout)
        return self._connection

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _permanent(self, message: str, records: int) -> None:
        """An error retrying cannot fix: logged at error (once per kind), kept in ``stats().error``; the records
        are counted as rejected."""
        if message != self.error:
            logger.error("fleetscope: cannot push to %s: %s (%d records dropped; every push will fail alike)",
                         self.url, message, records)
        self.error = message

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "fleetscope: cannot push to %s (%s); buffering and retrying", self.url, message
            )
        else:
            logger.debug("fleetscope: push to %s failed: %s", self.url, message)


def _cut(connection: http.client.HTTPConnection) -> None:
    """End an exchange that outlived its deadline: the blocked read returns at once and raises."""
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _register_cleanup(sender: Sender) -> None:
    ref = weakref.ref(sender)

    def flush_at_exit() -> None:
        live = ref()
        if live is not None:
            live.close(timeout=2.0)

    def reset_in_child() -> None:
        live = ref()
        if live is not None:
            live.after_fork()

    atexit.register(flush_at_exit)
    os.register_at_fork(after_in_child=reset_in_child)
