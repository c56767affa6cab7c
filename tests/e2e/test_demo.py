"""The default ``fleetscope demo --check``, as a user runs it: every scheduled fault raises its alert.

The command runs whole (its own daemons, Prometheus, Alertmanager when installed) on the shipped
schedule, and stops once every fault is decided; its exit status and its summary are the verdict.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from fleetscope_sim.cluster import make_cluster
from fleetscope_sim.detection import expectation
from fleetscope_sim.faults import parse_schedule
from fleetscope_sim.schedules import DEMO_SCHEDULE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_every_fault_of_the_default_demo_raises_its_alert(prometheus_binary: str,
                                                          port_run: Callable[[int], int]) -> None:
    base = port_run(12)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    result = subprocess.run(
        [sys.executable, "-m", "fleetscope", "demo", "--check", "--no-grafana", "--base-port", str(base),
         "--prometheus-port", str(base + 8), "--alertmanager-port", str(base + 9)],
        capture_output=True, text=True, timeout=840, check=False, env=env,
    )
    out = result.stdout
    print(out)  # the run's timeline and summary, for the log
    assert result.returncode == 0, out[-6000:] + result.stderr[-3000:]
    spec = make_cluster(nodes=8, jobs=2, faults=parse_schedule(DEMO_SCHEDULE))
    for fault in spec.faults:
        for pattern in expectation(fault, spec).expected:
            assert re.search(rf"FIRING +{pattern.alertname}( \(critical\))?  .* — detected \d+ s after {fault.kind}",
                             out), f"{pattern.describe()} for {fault.label()} not in the timeline"
    assert f"{len(spec.faults)} of {len(spec.faults)} faults detected with the right labels" in out
    assert "no scheduled fault explains it" not in out
