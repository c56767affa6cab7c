"""The NVML half of a capture: every question the collector asks, every answer with its return code."""

from __future__ import annotations

import os

import pytest
import yaml

from fleetscope.capture.nvml import capture_nvml
from fleetscope.collectors.gpu import GpuCollector
from fleetscope.config import load
from fleetscope.sources.nvml import NvmlSource
from fleetscope.sources.nvml_h import (
    FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    GPU_FIELDS,
    LINK_FIELDS,
)
from fleetscope_sim.nvml_fake import FakeNvml, install, installed, load_scenario, uninstall

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
        # Only a call that hangs for good meets the limit, so it costs nothing elsewhere: generous, because a
        # capture on a loaded machine can wait seconds for a core.
        result = capture_nvml(on_the_bus, timeout=kwargs.get("timeout", 10.0), gpm_interval=0.05, event_wait=0.05)
    assert result.scenario is not None, result.error
    return result.scenario


def _readings(fake: FakeNvml) -> dict[tuple[str, str, tuple[str, ...]], float]:
    """What the reader makes of GPU 0 at both detail levels: (level, value, labels) -> number."""
    install(fake)
    found: dict[tuple[str, str, tuple[str, ...]], float] = {}
    try:
        for level in ("default", "all"):
            source = NvmlSource(per_link=level == "all")
            try:
                gpu = next(sample for sample in source.read().samples if sample.identity.index == 0)
            finally:
                source.close()
            found.update({(level, value, ()): number for value, number in gpu.scalars.items()})
            found.update({(level, value, labels): number for value, labelled in gpu.labelled.items()
                          for labels, number in labelled.items()})
    finally:
        uninstall()
    return found


def test_every_field_of_the_table_is_read_captured_and_replayed(tmp_path) -> None:
    """A value of its own in every field's home in the fake; the reader reads each one (at its detail level),
    the capture keeps each one, and the replayed capture reads the same. A field the capture (or the fake)
    lacked would replay as NOT_SUPPORTED and be missing here."""
    fake = load_scenario("h100_8x_healthy")
    gpu = fake.gpu(0)
    gpu.set(nvlink_up=[True, False, True, True], gpm=None)  # without GPM: the PCIe byte counters are read
    numbers: dict[int, int] = {}
    for number, field in enumerate(GPU_FIELDS, start=1001):
        attr, key = field.home
        if field.value is None:
            continue
        numbers[field.id] = number
        if key is None:
            setattr(gpu, attr, number)
        else:
            getattr(gpu, attr)[key] = number
    for number, field in enumerate(LINK_FIELDS, start=1):
        attr, key = field.home
        if key is not None:
            getattr(gpu, attr)[key] = [number * 100 + link for link in range(len(gpu.nvlink_up))]
    expected = _readings(fake)
    crc = numbers[FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL] + numbers[FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL]
    for field in GPU_FIELDS:
        if field.value is None:
            continue
        levels = ("default", "all") if field.detail == "any" else (field.detail,)
        for level in levels:
            if field.detail == "default":  # an all-link NVLink total; the two CRC totals add up
                want = crc if field.labels == ("crc",) else numbers[field.id]
                assert expected[(level, field.value, ("", *field.labels))] == want, field
            else:
                assert expected[(level, field.value, field.labels)] == numbers[field.id], field
    assert expected[("all", "nvlink_up", ("1",))] == 0 and expected[("all", "nvlink_errors", ("3", "crc"))] == 403
    assert ("default", "nvlink_errors", ("3", "crc")) not in expected  # the totals stand for the links there

    fake = load_scenario("h100_8x_healthy")
    fake.gpus[0] = gpu
    with installed(fake):
        result = capture_nvml(timeout=10.0, gpm_interval=0.05, event_wait=0.05)
    assert result.scenario is not None, result.error
    path = tmp_path / "captured.yaml"
    path.write_text(yaml.safe_dump(result.scenario))
    assert _readings(load_scenario(str(path))) == expected


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
    capture_nvml(timeout=10.0, gpm_interval=0.05, event_wait=0.05)
    # the event watcher's wait loop is a daemon thread's business: the capture waits once
    assert asked_by_collector - set(fake.calls) <= {"nvmlEventSetWait_v2"}
    assert {"nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTotalEccErrors"} <= set(fake.calls)


def test_return_codes_are_kept_where_they_were_answered(tmp_path) -> None:
    path = tmp_path / "codes.yaml"
    path.write_text(CODES)
    scenario = _capture(str(path))
    gpu = scenario["defaults"] | scenario["gpus"][0]
    assert gpu["power_mw"] == "NVML_ERROR_NO_PERMISSION"
    assert gpu["clocks_mhz"] == {"graphics": 1320, "sm": 1320, "memory": "NVML_ERROR_UNKNOWN"}
    assert gpu["gpm"]["tensor_active"] == "NVML_ERROR_NOT_SUPPORTED" and gpu["gpm"]["sm_active"] == 96.25
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
    scenario = _capture("hanging_call", timeout=3.0)  # the one hang costs its limit once
    assert scenario["hang"] == ["nvmlDeviceGetPowerUsage"]
    scenario = _capture("lost_gpu")
    assert scenario["lost"] == [3] and scenario["pci_buses"][3] == 0x86  # its place from the PCI bus


def test_no_library_is_an_init_error() -> None:
    uninstall()  # this machine has no libnvidia-ml: the real binding finds none
    result = capture_nvml(timeout=2.0)
    assert result.scenario == {"description": "NVML unavailable (NVML_ERROR_LIBRARY_NOT_FOUND)",
                               "init_error": "NVML_ERROR_LIBRARY_NOT_FOUND", "pci_buses": []}
