"""The demo's pieces that need no running cluster: its rules and its cause lookup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetscope.promql import NODE_SLOWDOWN_CAUSES
from fleetscope_sim.demo import _causes, render_rules

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_loads_the_shipped_rules_rendered_from_the_installed_code(tmp_path: Path) -> None:
    compressed = Path(render_rules(str(tmp_path), production=False))
    production = Path(render_rules(str(tmp_path), production=True))
    assert compressed.read_text() == (ROOT / "alerts" / "fleetscope.e2e.rules.yml").read_text()
    assert production.read_text() == (ROOT / "alerts" / "fleetscope.rules.yml").read_text()


class CauseSeries:
    def __init__(self, series: list[dict[str, str]] | Exception) -> None:
        self.series = series
        self.asked: list[str] = []

    def query(self, expr: str) -> list[dict[str, Any]]:
        self.asked.append(expr)
        if isinstance(self.series, Exception):
            raise self.series
        return [{"metric": labels, "value": [0, "1"]} for labels in self.series]


def test_a_straggler_is_given_its_node_causes_and_its_own_gpu_causes_only() -> None:
    prometheus = CauseSeries([{"instance": "node-01", "gpu": "3", "cause": "gpu_throttled"},
                              {"instance": "node-01", "gpu": "2", "cause": "gpu_low_sm_clock"},
                              {"instance": "node-01", "cause": "efa_retransmits"}])
    assert _causes(prometheus, {"instance": "node-01", "gpu": "3"}) == ["efa_retransmits", "gpu_throttled"]  # type: ignore[arg-type]
    assert prometheus.asked == [f'{NODE_SLOWDOWN_CAUSES}{{instance="node-01"}}']
    assert _causes(CauseSeries(OSError("refused")), {"instance": "node-01"}) == []  # type: ignore[arg-type]
    assert _causes(prometheus, {"training_job": "job-a"}) == []  # type: ignore[arg-type]
