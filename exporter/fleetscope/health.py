"""Health findings for ``fleetscope check``.

Collectors that know what "unhealthy" means for their hardware implement
``health() -> list[Finding]``. ``check`` prints one line per finding and exits
0 (healthy), 1 (unhealthy) or 2 (could not tell).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["unhealthy", "warning", "unknown"]

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNKNOWN = 2


@dataclass(frozen=True)
class Finding:
    collector: str
    severity: Severity
    subject: str  # what the finding is about: "efa rdmap79s0", "gpu 3", "node"; empty for the node as a whole
    message: str

    def line(self) -> str:
        about = f"{self.subject}: " if self.subject else ""
        return f"{self.severity.upper()} {self.collector}: {about}{self.message}"


def verdict(findings: list[Finding]) -> int:
    if any(f.severity == "unhealthy" for f in findings):
        return EXIT_UNHEALTHY
    if any(f.severity == "unknown" for f in findings):
        return EXIT_UNKNOWN
    return EXIT_HEALTHY
