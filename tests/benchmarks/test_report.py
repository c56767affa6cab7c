from __future__ import annotations

import math

from benchmarks.harness import NodeShape, PushOutcome
from benchmarks.measure import NodeResults, VariantResult
from benchmarks.report import MIB, Target, kubernetes_resources, mib


def target(measured: float, lower_is_better: bool = True) -> Target:
    return Target("x", "goal", measured, 10.0, lower_is_better, str)


def test_target_verdict_says_by_how_much_a_target_is_missed() -> None:
    assert target(5.0).verdict == "met"
    assert target(25.0).verdict == "**missed** (2.50x the target)"
    assert target(20.0, lower_is_better=False).verdict == "met"
    assert target(4.0, lower_is_better=False).verdict == "**missed** (2.50x the target)"
    assert target(10.2).verdict == "**missed** (1.02x the target)"
    assert target(math.nan).verdict == "not measured"


def node_results(cpu: float, rss_mib: float, latencies: list[float]) -> NodeResults:
    variants = [
        VariantResult(NodeShape("p5"), cpu, int(rss_mib * MIB), int(rss_mib * MIB), 60.0, 4, {"sent": 1}),
        VariantResult(NodeShape("64 ranks", ranks=64), cpu * 2, int(rss_mib * 1.1 * MIB), 0, 60.0, 4, {}),
    ]
    return NodeResults(variants, [], latencies, 0, {}, 0, [], PushOutcome(0, 0, 0, 1.0), 0)


def test_kubernetes_resources_follow_the_stated_rules() -> None:
    small = kubernetes_resources(node_results(0.002, 40.0, [0.01] * 10))
    assert small == {"cpu_request": "10m", "cpu_limit": "250m", "memory_request": "64Mi", "memory_limit": "128Mi"}
    # 2 x 2.3% = 46m -> 50m; render 73 ms -> 750m; worst peak 55 x 1.1 = 60.5 MiB -> 80Mi / 128Mi.
    busy = kubernetes_resources(node_results(0.023, 55.0, [0.073] * 10))
    assert busy == {"cpu_request": "50m", "cpu_limit": "750m", "memory_request": "80Mi", "memory_limit": "128Mi"}


def test_sizes_are_reported_in_mebibytes() -> None:
    assert mib(80 * MIB) == "80.0 MiB"


def test_memory_limit_covers_a_burst_of_the_largest_bodies() -> None:
    node = node_results(0.009, 56.0, [0.04] * 10)
    assert kubernetes_resources(node)["memory_limit"] == "128Mi"  # 2 x 61.6 MiB
    node.peak_rss_after_burst = int(112.8 * MIB)  # 1.5 x 112.8 = 169.2 MiB
    assert kubernetes_resources(node)["memory_limit"] == "192Mi"
