"""The hardware session's tools, run here over the NVML fake: the call counter, the cost, the report."""

from __future__ import annotations

import os

import pytest

from benchmarks.real_gpu import cost_section, field_costs, kernel_log_lines, plausibility, report, scenario_differences
from fleetscope.capture.archive import render, take_snapshot, write_archive
from fleetscope_sim.nvml_fake import uninstall
from tests.capture.nodes import KMSG, FixtureNode


@pytest.fixture(autouse=True)
def no_fake_left() -> object:
    yield
    uninstall()


def test_plausibility_rules_can_fail() -> None:
    samples: dict[str, list[float]] = {'fleetscope_gpu_power_limit_watts{gpu="0"}': [700.0]}
    assert plausibility('fleetscope_gpu_power_watts{gpu="0"}', [70.0], [650.0], samples).startswith("ok")
    assert plausibility('fleetscope_gpu_power_watts{gpu="0"}', [70.0], [80.0], samples).startswith("IMPLAUSIBLE")
    assert plausibility("fleetscope_gpu_utilization_ratio{}", [0.0], [0.2], samples).startswith("IMPLAUSIBLE")
    assert plausibility("fleetscope_gpu_energy_joules_total{}", [10.0], [9.0], samples).startswith("IMPLAUSIBLE")


def test_the_report_lists_every_gpu_field_and_the_scenario_differences(tmp_path) -> None:
    node = FixtureNode.build(str(tmp_path / "node"), "p5", "h100_8x_healthy")
    fake = node.fake()
    snapshot = take_snapshot(node.config, nvml_timeout=10.0, gpm_interval=0.05, event_wait=0.05)
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
    snapshot = take_snapshot(node.config, nvml_timeout=10.0, gpm_interval=0.05, event_wait=0.05)
    assert fake is not None
    fake.release()
    capture = str(tmp_path / "older.tar.gz")
    write_archive(render(snapshot), capture)
    rows = "\n".join(scenario_differences(capture))
    assert "| `driver_version` | 550.90.07 | 525.147.05 |" in rows and "| `missing_functions` |" in rows
    assert "| `recovery_action` | 0 | NVML_ERROR_NOT_SUPPORTED |" in rows


def test_the_cost_section_sets_real_nvml_beside_the_model_and_lists_each_field() -> None:
    from benchmarks.gpu_cost import model_cost

    modelled = model_cost("h100_8x_healthy", cycles=6)
    real = {**modelled, "on": "real NVML", "gpus": 1}  # shaped like a real run's result
    fields = {"repeats": 3, "alone": {"83": {"what": "energy", "us": 210.0, "answer": "ok", "nvml_latency_us": 180},
                                      "29": {"what": "retired_pages/single_bit", "us": 95.0,
                                             "answer": "Not Supported", "nvml_latency_us": 0}},
              "batches": {"those answered": {"fields": 1, "us": 212.0}}}
    results = {"cost_idle": {"ok": True, "value": real}, "model_p5": {"ok": True, "value": modelled},
               "fields_idle": {"ok": True, "value": fields}, "cost_load": {"ok": False, "error": "x"}}
    text = "\n".join(cost_section(results))
    assert "| real NVML, idle | 1 | 18 |" in text and "| latency model, p5: 8 H100s with NVLink | 8 | 18 |" in text
    assert "real NVML, idle: the latency model books" in text  # its prediction for the real call mix
    assert "| 29 | retired_pages/single_bit | Not Supported | 95.0 |  | 0 |" in text
    assert "| those answered | 1 | 212.0 |  |" in text


def test_field_costs_ask_every_field_of_the_table_alone(tmp_path) -> None:
    # On the H100 it broke once on a renamed table (an AttributeError, no figures): it runs here on the fake.
    from fleetscope.sources import nvml_h

    node = FixtureNode.build(str(tmp_path / "node"), "p5", "h100_8x_healthy")
    fake = node.fake()
    assert fake is not None
    costs = field_costs(repeats=1)
    assert {int(i) for i in costs["alone"]} == {field.id for field in nvml_h.FIELDS}
    assert costs["alone"][str(nvml_h.FI_DEV_REMAPPED_COR)]["what"] == "remapped_rows/correctable"
    assert costs["alone"][str(nvml_h.FI_DEV_REMAPPED_COR)]["answer"] == "ok"
    assert costs["batches"]["the 21 of the report"]["fields"] == 21


def test_the_load_is_scraped_only_once_its_first_products_ran() -> None:
    import subprocess
    import sys

    import pytest

    from benchmarks.real_gpu import _wait_running

    def load(code: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    started = load("import time; time.sleep(0.5); print('running', flush=True); time.sleep(5)")
    try:
        assert _wait_running(started, timeout=30.0) >= 0.5
    finally:
        started.kill()
        started.communicate()
    for code in ("import sys; sys.exit(3)", "import time; time.sleep(30)"):  # died, or never started
        failed = load(code)
        try:
            with pytest.raises(RuntimeError, match="did not start"):
                _wait_running(failed, timeout=1.0)
        finally:
            failed.kill()
            failed.communicate()
