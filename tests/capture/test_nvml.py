"""The NVML half of a capture: every question the collector asks, every answer with its return code."""

from __future__ import annotations

import os

import pytest

from fleetscope.capture.nvml import FIELD_HOMES, capture_nvml
from fleetscope.collectors.gpu import GpuCollector
from fleetscope.config import load
from fleetscope.sources.nvml import FIELD_NVLINK_LINK_COUNT, SCALAR_FIELDS
from fleetscope_sim.nvml_fake import install, installed, load_scenario, uninstall

CODES = """base: h100_8x_healthy
defaults:
  power_mw: NVML_ERROR_NO_PERMISSION
  clocks_mhz: {memory: NVML_ERROR_UNKNOWN}
  gpm: {tensor_active: NVML_ERROR_NOT_SUPPORTED}
  errors: {field:83: NVML_ERROR_NO_PERMISSION, nvmlDeviceGetTemperatureV: NVML_ERROR_NOT_SUPPORTED}
gpus:
  7: {errors: {nvmlDeviceGetHandleByIndex_v2: NVML_ERROR_INSUFFICIENT_POWER}}
"""


@pytest.fixture(autouse=True)
def no_fake_left() -> object:
    yield
    uninstall()


def _capture(scenario: str, **kwargs: float) -> dict:
    fake = load_scenario(scenario)
    on_the_bus = [(g.pci_domain, g.pci_bus, g.pci_device) for g in fake.gpus]  # what sysfs would list
    with installed(fake):
        result = capture_nvml(on_the_bus, timeout=kwargs.get("timeout", 2.0), gpm_interval=0.05, event_wait=0.05)
    assert result.scenario is not None, result.error
    return result.scenario


def test_every_field_the_reader_reads_has_a_home_in_the_fake() -> None:
    assert set(SCALAR_FIELDS) == set(FIELD_HOMES)
    assert FIELD_NVLINK_LINK_COUNT not in FIELD_HOMES  # the link count is the length of nvlink_up


def test_the_capture_asks_everything_the_collector_asks(tmp_path) -> None:
    fake = load_scenario("h100_8x_healthy")
    install(fake)
    collector = GpuCollector(load({"path.sysfs": str(tmp_path), "path.procfs": str(tmp_path),
                                   "path.kmsg": os.path.join(str(tmp_path), "kmsg")}, environ={}))
    collector.collect()
    collector.collect()
    collector.close()
    asked_by_collector = set(fake.calls)
    fake = load_scenario("h100_8x_healthy")
    install(fake)
    capture_nvml(timeout=2.0, gpm_interval=0.05, event_wait=0.05)
    # the event watcher's wait loop is a daemon thread's business: the capture waits once
    assert asked_by_collector - set(fake.calls) <= {"nvmlEventSetWait_v2"}
    assert {"nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTotalEccErrors"} <= set(fake.calls)


def test_return_codes_are_kept_where_they_were_answered(tmp_path) -> None:
    path = tmp_path / "codes.yaml"
    path.write_text(CODES)
    scenario = _capture(str(path))
    gpu = scenario["defaults"] | scenario["gpus"][0]
    assert gpu["power_mw"] == "NVML_ERROR_NO_PERMISSION"
    assert gpu["clocks_mhz"] == {"graphics": 1980, "sm": 1980, "memory": "NVML_ERROR_UNKNOWN"}
    assert gpu["gpm"]["tensor_active"] == "NVML_ERROR_NOT_SUPPORTED" and gpu["gpm"]["sm_active"] == 82.5
    # the field refused, the older call answered: the value is kept, the field keeps its own code
    assert gpu["energy_mj"] == 987654321 and gpu["errors"]["field:83"] == "NVML_ERROR_NO_PERMISSION"
    assert gpu["temperature"] == 52 and gpu["errors"]["nvmlDeviceGetTemperatureV"] == "NVML_ERROR_NOT_SUPPORTED"
    assert scenario["gpus"][7]["errors"] == {"nvmlDeviceGetHandleByIndex_v2": "NVML_ERROR_INSUFFICIENT_POWER"}
    # GPU 7 never told NVML's bus id: its place comes from the PCI bus
    assert scenario["pci_buses"] == [0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA]


def test_a_driver_without_newer_symbols_lists_them_missing() -> None:
    scenario = _capture("older_driver")
    assert {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetMemoryInfo_v2",
            "nvmlGpmQueryDeviceSupport"} <= set(scenario["missing_functions"])
    gpu = scenario["defaults"]
    assert gpu["throttle_reasons"] == 4 and gpu["temperature"] == 52
    assert gpu["recovery_action"] == "NVML_ERROR_NOT_SUPPORTED"  # field 230 is newer than the driver


def test_a_hanging_call_and_a_lost_gpu_become_the_scenario_s_hang_and_lost() -> None:
    scenario = _capture("hanging_call", timeout=0.5)
    assert scenario["hang"] == ["nvmlDeviceGetPowerUsage"]
    scenario = _capture("lost_gpu")
    assert scenario["lost"] == [3] and scenario["pci_buses"][3] == 0x86  # its place from the PCI bus


def test_no_library_is_an_init_error() -> None:
    uninstall()  # this machine has no libnvidia-ml: the real binding finds none
    result = capture_nvml(timeout=2.0)
    assert result.scenario == {"description": "NVML unavailable (NVML_ERROR_LIBRARY_NOT_FOUND)",
                               "init_error": "NVML_ERROR_LIBRARY_NOT_FOUND", "pci_buses": []}
