"""The GPU collector's cost per cycle on the NVML fake's H100 latency model (#25): what it calls, and what
that costs by the model's figures (call counts times measured microseconds: no timing of this machine)."""

from __future__ import annotations

import pytest

from benchmarks.gpu_cost import collector_cost, markdown, model_cost, predicted_nvml_ms
from fleetscope_sim.nvml_fake import install, load_scenario, uninstall


@pytest.fixture(autouse=True)
def no_fake_left() -> object:
    yield
    uninstall()


def test_eight_h100s_with_nvlink_cost_at_most_the_budget_inside_nvml() -> None:
    result = model_cost("h100_8x_healthy", cycles=12)  # 2 minutes: every GPU's slow values read twice
    assert (result["gpus"], result["nvlinks_per_gpu"], result["latency"]) == (8, 18, "h100_sxm_580")
    per_cycle = {name: entry["calls_per_cycle"] for name, entry in result["by_symbol"].items()}
    assert per_cycle["nvmlDeviceGetPowerUsage"] == 8 and per_cycle["nvmlDeviceGetFieldValues"] == 16 / 12
    # no constant, no 20 ms PCIe sample, no NOT_SUPPORTED fan after the first cycle
    assert not {"nvmlDeviceGetPcieThroughput", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetFanSpeed",
                "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetHandleByIndex_v2"} & set(per_cycle)
    # 16 slow reads of 42 fields (18 NVLink states, 4 all-link error totals) in 12 cycles
    assert result["fields_per_cycle"] == pytest.approx(16 * 42 / 12)
    # what NVML costs per GPU and cycle on the model: call counts times the model's figures, no timing (the
    # budget is 3 ms with the collector's own time; 2.4 ms, 0.85 of it the NVLink fields' assumed cost)
    assert result["nvml_ms_per_cycle"] / 8 < 2.5
    assert result["first_cycle_calls"] > 2 * result["nvml_calls_per_cycle"]


def test_per_link_nvlink_counters_cost_more_at_detail_all() -> None:
    default = model_cost("h100_8x_healthy", cycles=6)
    detailed = model_cost("h100_8x_healthy", cycles=6, detail="all")
    # per slow read: 54 per-link counters instead of 4 totals, and 5 PCIe link-event counters
    assert detailed["fields_per_cycle"] - default["fields_per_cycle"] == pytest.approx((18 * 3 - 4 + 5) * 8 / 6)
    assert detailed["nvml_ms_per_cycle"] > default["nvml_ms_per_cycle"]


def test_the_counter_counts_what_the_library_sees_and_the_model_predicts_it(tmp_path) -> None:
    fake = load_scenario("h100_8x_healthy")
    install(fake)
    settings = {"path.sysfs": str(tmp_path), "path.procfs": str(tmp_path), "gpu.kmsg": False}
    cost = collector_cost(6, settings)  # as on real NVML: wall time, the fake's booking not read
    fake.release()
    per_cycle = {name: spent["calls_per_cycle"] for name, spent in cost["by_symbol"].items()}
    assert cost["on"] == "real NVML" and per_cycle["nvmlDeviceGetUtilizationRates"] == 8
    assert cost["nvml_calls_per_cycle"] == pytest.approx(sum(per_cycle.values()))
    assert all(fake.calls[name] >= 6 * calls for name, calls in per_cycle.items())
    # the same call mix, booked by the model: what the fake booked for the measured cycles, but for the
    # first nvmlGpmMetricsGet (2.6 ms, once a process), which falls into the second cycle
    modelled = model_cost("h100_8x_healthy", cycles=6)
    first_gpm_metrics = (2632.0 - 81.9) / 1000 / 6
    assert predicted_nvml_ms(cost, "h100_sxm_580") + first_gpm_metrics == pytest.approx(
        modelled["nvml_ms_per_cycle"], abs=0.002)
    table = markdown([cost, modelled])
    assert len(table) == 4 and "| latency model, h100_8x_healthy | 8 | 18 | default |" in table[3]


def test_fabric_nvlink_traffic_and_mig_stay_within_the_cost_ceiling() -> None:
    """#38: the fabric state is one call per GPU per slow read, NVLink traffic rides in the GPM request every
    collection already makes (or, without GPM, two driver counters per slow read), and a MIG instance costs its
    memory and its own GPM sample. Per GPU and cycle inside NVML on the model, within the 3 ms ceiling."""
    p5 = model_cost("h100_8x_healthy", cycles=12)
    per_cycle = {name: entry["calls_per_cycle"] for name, entry in p5["by_symbol"].items()}
    assert per_cycle["nvmlDeviceGetGpuFabricInfoV"] == 16 / 12  # with the slow reads: 8 GPUs, twice in 2 minutes
    assert per_cycle["nvmlGpmMetricsGet"] == 8  # NVLink's rates in the request the ratios already make
    assert p5["nvml_ms_per_cycle"] / 8 < 2.5
    a100 = model_cost("a100_8x", latency="h100_sxm_580", cycles=12)
    assert a100["by_field"]["138"]["answered_per_cycle"] == 16 / 12  # all links at once (scope UINT_MAX)
    assert a100["nvml_ms_per_cycle"] / 8 < 2.5
    mig = model_cost("mig_enabled", cycles=12)
    per_cycle = {name: entry["calls_per_cycle"] for name, entry in mig["by_symbol"].items()}
    assert per_cycle["nvmlGpmMigSampleGet"] == 3 + 3 * 2  # every GPU instance, every collection
    assert mig["nvml_ms_per_cycle"] / 8 < 3.0
