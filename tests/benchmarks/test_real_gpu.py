"""The hardware session's tools, run here over the NVML fake: the call counter, the cost, the report."""

from __future__ import annotations

import os

import pytest

from benchmarks.real_gpu import collector_cost, kernel_log_lines, plausibility, report, scenario_differences
from fleetscope.capture.archive import render, take_snapshot, write_archive
from fleetscope_sim.nvml_fake import install, load_scenario, uninstall
from tests.capture.nodes import KMSG, FixtureNode


@pytest.fixture(autouse=True)
def no_fake_left() -> object:
    yield
    uninstall()


def test_collector_cost_counts_the_calls_the_library_sees(tmp_path) -> None:
    fake = load_scenario("h100_8x_healthy")
    install(fake)
    settings = {"path.sysfs": str(tmp_path), "path.procfs": str(tmp_path), "gpu.kmsg": False}
    cost = collector_cost(5, settings)
    fake.release()
    # the fake counts every call, the counter only the measured cycles of the collecting thread
    per_cycle = {name: spent["calls_per_cycle"] for name, spent in cost["by_symbol"].items()}
    assert per_cycle["nvmlDeviceGetPowerUsage"] == 8 and per_cycle["nvmlDeviceGetFieldValues"] == 16
    assert cost["nvml_calls_per_cycle"] == sum(per_cycle.values()) and cost["nvml_calls_per_cycle"] > 200
    assert all(fake.calls[name] >= 5 * calls for name, calls in per_cycle.items())
    assert 0 < cost["nvml_ms_per_cycle"] <= cost["ms_median"] * 1.5


def test_plausibility_rules_can_fail() -> None:
    samples: dict[str, list[float]] = {'fleetscope_gpu_power_limit_watts{gpu="0"}': [700.0]}
    assert plausibility('fleetscope_gpu_power_watts{gpu="0"}', [70.0], [650.0], samples).startswith("ok")
    assert plausibility('fleetscope_gpu_power_watts{gpu="0"}', [70.0], [80.0], samples).startswith("IMPLAUSIBLE")
    assert plausibility("fleetscope_gpu_utilization_ratio{}", [0.0], [0.2], samples).startswith("IMPLAUSIBLE")
    assert plausibility("fleetscope_gpu_energy_joules_total{}", [10.0], [9.0], samples).startswith("IMPLAUSIBLE")


def test_the_report_lists_every_gpu_field_and_the_scenario_differences(tmp_path) -> None:
    node = FixtureNode.build(str(tmp_path / "node"), "p5", "h100_8x_healthy")
    fake = node.fake()
    snapshot = take_snapshot(node.config, nvml_timeout=1.0, gpm_interval=0.05, event_wait=0.05)
    assert fake is not None
    fake.release()
    capture = str(tmp_path / "h100_real.tar.gz")
    write_archive(render(snapshot), capture)
    idle = {'fleetscope_gpu_utilization_ratio{gpu="0"}': 0.0, 'fleetscope_gpu_power_watts{gpu="0"}': 70.0}
    busy = {'fleetscope_gpu_utilization_ratio{gpu="0"}': 1.0, 'fleetscope_gpu_power_watts{gpu="0"}': 690.0}
    results = {"idle_scrapes": {"ok": True, "value": [idle]}, "load_scrapes": {"ok": True, "value": [busy, busy]},
               "load": {"ok": False, "error": "RuntimeError: no CUDA"}}
    text = report(results, capture)
    assert '| `fleetscope_gpu_utilization_ratio{gpu="0"}` | ratio | 1+2 | 0 | 1 | ok: near 1' in text
    assert "| `fleetscope_gpu_fan_speed_ratio` | ratio | absent |" in text
    assert "* load: RuntimeError: no CUDA" in text
    # the fixture's scenario is h100_8x_healthy itself, captured: nothing differs
    assert scenario_differences(capture)[2:] == []


def test_kernel_log_lines_are_the_driver_s_redacted() -> None:
    lines = kernel_log_lines(KMSG)
    assert lines["readable"] and lines["records_read"] > 10
    assert any("loading NVIDIA UNIX x86_64 Kernel Module" in line for line in lines["nvrm_lines"])
    assert not any("1654922000000" in line or "GPU-11111111" in line for line in lines["nvrm_lines"])
    assert os.path.basename(KMSG) == "variants.kmsg"


def test_scenario_differences_name_what_differs(tmp_path) -> None:
    node = FixtureNode.build(str(tmp_path / "node"), "p5", "older_driver")
    fake = node.fake()
    snapshot = take_snapshot(node.config, nvml_timeout=1.0, gpm_interval=0.05, event_wait=0.05)
    assert fake is not None
    fake.release()
    capture = str(tmp_path / "older.tar.gz")
    write_archive(render(snapshot), capture)
    rows = "\n".join(scenario_differences(capture))
    assert "| `driver_version` | 550.90.07 | 525.147.05 |" in rows and "| `missing_functions` |" in rows
    assert "| `recovery_action` | 0 | NVML_ERROR_NOT_SUPPORTED |" in rows
