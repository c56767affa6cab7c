"""``fleetscope check``: ask every enabled collector for its health findings, once."""

from __future__ import annotations

import logging
import threading
from typing import Any

from fleetscope.config import Config
from fleetscope.daemon import build_collectors
from fleetscope.errors import NoHardware
from fleetscope.health import Finding, verdict

logger = logging.getLogger("fleetscope.check")


def _health(name: str, collector: Any, timeout: float) -> list[Finding]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["findings"] = list(collector.health())
        except NoHardware:
            result["findings"] = []
        except Exception as exc:
            result["error"] = exc

    worker = threading.Thread(target=run, name=f"check-{name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return [Finding(name, "unknown", "collector", f"no answer within {timeout:.0f}s")]
    if "error" in result:
        return [Finding(name, "unknown", "collector", f"could not read: {result['error']}")]
    return result["findings"]


def run_check(config: Config, timeout: float = 20.0, collectors: dict[str, Any] | None = None) -> tuple[list[Finding], int]:
    built = collectors if collectors is not None else build_collectors(config)
    findings: list[Finding] = []
    for name, collector in built.items():
        if hasattr(collector, "health"):
            findings.extend(_health(name, collector, timeout))
    for collector in built.values():
        close = getattr(collector, "close", None)
        if close:
            close()
    return findings, verdict(findings)
