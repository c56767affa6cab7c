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


def gpu_run(ms_per_gpu: float) -> dict[str, object]:
    """A benchmarks.gpu_cost result, as section 6c and the headline read it."""
    return {"label": "p5", "gpus": 8, "cycles": 6, "interval_s": 10.0, "on": "latency model", "detail": "default",
            "ms_median": ms_per_gpu * 8, "ms_p95": ms_per_gpu * 9, "ms_per_gpu_median": ms_per_gpu,
            "ms_per_gpu_mean": ms_per_gpu, "nvml_ms_per_cycle": 1.0, "nvml_calls_per_cycle": 120.0,
            "fields_per_cycle": 50.0, "first_cycle_ms": 200.0, "first_cycle_calls": 290, "nvlinks_per_gpu": 18}


def test_an_update_rewrites_only_the_parts_measured_again(tmp_path) -> None:
    from benchmarks.measure import Environment, Settings
    from benchmarks.report import Results, render, update
    from benchmarks.scrape import ScrapeSettings

    def results(ms_per_gpu: float) -> Results:
        return Results(Settings.quick(str(tmp_path)), ScrapeSettings.quick(str(tmp_path), None),
                       Environment("cpu", 2, 2), gpu=[gpu_run(ms_per_gpu)])

    # a full run's report, with a figure of its own in a section the update does not measure
    full = render(results(2.5), "2026-11-26 18:00 UTC", False, 700).replace(
        "## 4. Daemon CPU and memory\n", "## 4. Daemon CPU and memory\n\nThe p5 daemon: 0.40% of one core.\n")
    updated = update(full, results(3.5), ["gpu"], "2026-11-27 09:00 UTC", 40)
    old_lines, new_lines = full.splitlines(), updated.splitlines()
    assert "| 20.0 ms (22.5 ms) | 2.5 ms, 2.5 ms |" in full and "| 28.0 ms (31.5 ms) | 3.5 ms, 3.5 ms |" in updated
    gpu_row = "| GPU collector per GPU per cycle, 8 H100s with NVLink, on the NVML latency model (median) |"
    row = next(line for line in new_lines if line.startswith(gpu_row))
    assert row.endswith("| 3.50 ms | **missed** (1.17x the target) |")
    assert any(line.startswith("* **GPU collector per GPU per cycle") for line in new_lines)  # its miss, said
    # the node's sections (not measured again) are as the full run wrote them
    node_section = [line for line in old_lines if "0.40% of one core" in line]
    assert node_section and all(line in new_lines for line in node_section)
    assert "Section 6c measured again on 2026-11-27 09:00 UTC" in updated and "Run on 2026-11-26 18:00" in updated
    again = update(updated, results(2.0), ["gpu"], "2026-11-28 09:00 UTC", 40)
    assert again.count("Section 6c measured again") == 1 and "* **GPU collector per GPU" not in again
    assert "Where targets are missed" not in again.split("## Machine")[0]
