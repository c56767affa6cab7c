"""``fleetscope check``: ask every enabled collector for its health findings, once.

The whole check answers within its timeout, whatever a source does: every
collector's ``health()`` runs on its own daemon thread at once, a collector
that has not answered by the deadline is reported as "could not tell", and
its thread (stuck in a driver call, holding the source's lock) is abandoned
rather than waited for, closing included.
"""

from __future__ import annotations

import logging
import threading
import time

from fleetscope.collectors.protocol import Closeable, Collector, HealthCheck
from fleetscope.config import Config
from fleetscope.daemon import build_collectors
from fleetscope.errors import NoHardware
from fleetscope.health import Finding, verdict

logger = logging.getLogger("fleetscope.check")

CLOSE_GRACE = 2.0  # seconds closing the collectors that answered may add after the deadline


class _HealthCall:
    """One collector's ``health()`` on a daemon thread."""

    def __init__(self, name: str, collector: HealthCheck) -> None:
        self.name = name
        self.findings: list[Finding] = []
        self.error: Exception | None = None
        self._collector = collector
        self._thread = threading.Thread(target=self._run, name=f"check-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self.findings = list(self._collector.health())
        except NoHardware:
            self.findings = []
        except Exception as exc:
            self.error = exc

    def wait(self, deadline: float) -> bool:
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def result(self, answered: bool, timeout: float) -> list[Finding]:
        if not answered:
            return [Finding(self.name, "unknown", "collector", f"no answer within {timeout:g}s")]
        if self.error is not None:
            return [Finding(self.name, "unknown", "collector",
                            f"could not read: {type(self.error).__name__}: {self.error}")]
        return self.findings


def _close(collectors: list[Collector], wait: float) -> None:
    """Close collectors on a daemon thread, waiting at most ``wait`` seconds (closing is best effort)."""

    def run() -> None:
        for collector in collectors:
            if not isinstance(collector, Closeable):
                continue
            try:
                collector.close()
            except Exception as exc:
                logger.debug("closing %s: %s", type(collector).__name__, exc)

    closer = threading.Thread(target=run, name="check-close", daemon=True)
    closer.start()
    closer.join(wait)


def run_check(
    config: Config, timeout: float = 20.0, collectors: dict[str, Collector] | None = None
) -> tuple[list[Finding], int]:
    """Findings of every collector and the verdict, within ``timeout`` seconds (plus a short grace to close)."""
    deadline = time.monotonic() + timeout
    built = collectors if collectors is not None else build_collectors(config)
    calls = [_HealthCall(name, collector) for name, collector in built.items() if isinstance(collector, HealthCheck)]
    for call in calls:
        call.start()
    findings: list[Finding] = []
    stuck: set[str] = set()
    for call in calls:
        answered = call.wait(deadline)
        if not answered:
            stuck.add(call.name)
        findings.extend(call.result(answered, timeout))
    # A collector still inside health() holds its source's locks: closing it would wait on them.
    _close([c for name, c in built.items() if name not in stuck], CLOSE_GRACE)
    return findings, verdict(findings)
