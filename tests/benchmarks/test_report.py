from __future__ import annotations

import math

from benchmarks.harness import NodeShape, PushOutcome
from benchmarks.measure import NodeResults, VariantResult
from benchmarks.report import MIB, Target, kubernetes_resources, mib
from benchmarks.scrape import PartCost, ScrapePath


def target(measured: float, lower_is_better: bool = True) -> Target:
    return Target("x", "goal", measured, 10.0, lower_is_better, str)


def test_target_verdict_says_by_how_much_a_target_is_missed() -> None:
    assert target(5.0).verdict == "met"
    assert target(10.0).verdict == "met"  # goals are written as <= and >=
    assert target(25.0).verdict == "**missed** (2.50x the target)"
    assert target(20.0, lower_is_better=False).verdict == "met"
    assert target(4.0, lower_is_better=False).verdict == "**missed** (2.50x the target)"
    assert target(10.2).verdict == "**missed** (1.02x the target)"
    assert target(math.nan).verdict == "not measured"


def node_results(cpu: float, rss_mib: float) -> NodeResults:
    variants = [
        VariantResult(NodeShape("p5"), cpu, int(rss_mib * MIB), int(rss_mib * MIB), 60.0, 4, {"sent": 1}),
        VariantResult(NodeShape("64 ranks", ranks=64), cpu * 2, int(rss_mib * 1.1 * MIB), 0, 60.0, 4, {}),
    ]
    return NodeResults(variants, [], {}, 0, [], PushOutcome(0, 0, 0, 1.0), 0)


def path(efa_collect: float, efa_render: float, gpu_collect: float) -> ScrapePath:
    return ScrapePath([], [
        PartCost("`efa` collection", efa_collect, "every 15 s"),
        PartCost("`efa` render, OpenMetrics", efa_render, "every 15 s"),
        PartCost("`efa` render, text 0.0.4", 1.0, "when asked for"),  # not part of a reading's burst
        PartCost("`gpu` collection", gpu_collect, "every 10 s"),
    ], [], {})


def test_kubernetes_resources_follow_the_stated_rules() -> None:
    small = kubernetes_resources(node_results(0.002, 40.0), None, path(0.010, 0.005, 0.008))
    assert small == {"cpu_request": "10m", "cpu_limit": "250m", "memory_request": "64Mi", "memory_limit": "128Mi"}
    # 2 x 2.3% = 46m -> 50m; largest reading 0.045 + 0.028 = 73 ms -> 750m; worst peak 60.5 MiB -> 80Mi / 128Mi.
    busy = kubernetes_resources(node_results(0.023, 55.0), None, path(0.045, 0.028, 0.030))
    assert busy == {"cpu_request": "50m", "cpu_limit": "750m", "memory_request": "80Mi", "memory_limit": "128Mi"}


def test_sizes_are_reported_in_mebibytes() -> None:
    assert mib(80 * MIB) == "80.0 MiB"


def test_memory_limit_covers_a_burst_of_the_largest_bodies() -> None:
    node = node_results(0.009, 56.0)
    assert kubernetes_resources(node, None, None)["memory_limit"] == "128Mi"  # 2 x 61.6 MiB
    node.peak_rss_after_burst = int(112.8 * MIB)  # 1.5 x 112.8 = 169.2 MiB
    assert kubernetes_resources(node, None, None)["memory_limit"] == "192Mi"
