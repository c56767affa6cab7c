"""The NVML source against the real pynvml code with the fake native library installed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from fleetscope.errors import NoHardware
from fleetscope.sources.nvml import NvmlSource
from fleetscope.sources.xid import PciAddress, XidSighting
from fleetscope_sim.nvml_fake import FakeNvml, NvmlReturn, install, load_scenario, uninstall


@pytest.fixture
def scenario() -> Iterator[Callable[[str], FakeNvml]]:
    installed: list[FakeNvml] = []

    def use(name: str) -> FakeNvml:
        fake = load_scenario(name)
        install(fake)
        installed.append(fake)
        return fake

    yield use
    for fake in installed:
        fake.release()
    uninstall()


def by_index(reading) -> dict:
    return {s.identity.index: s for s in reading.samples}


def test_h100_values_in_nvml_units(scenario) -> None:
    scenario("h100_8x_healthy")
    source = NvmlSource()
    source.read()
    reading = source.read()  # GPM rates need two samples
    assert (reading.device_count, reading.driver_version, reading.nvml_version) == (8, "550.90.07", "12.550.90.07")
    gpu = by_index(reading)[5]
    assert gpu.identity.pci_bus_id == "00000000:A8:00.0" and gpu.identity.pci == PciAddress(0, 0xA8, 0)
    assert (gpu.identity.architecture, gpu.identity.mig_mode) == ("hopper", "disabled")
    assert gpu.scalars["power"] == 692345 and gpu.scalars["energy"] == 987654321
    assert gpu.scalars["memory_reserved"] == 503316480 and gpu.scalars["memory_temperature"] == 61
    assert gpu.labelled["clock"][("sm",)] == 1320 and gpu.labelled["clock_max"][("sm",)] == 1980
    assert gpu.labelled["throttle_active"][("sw_power_cap",)] == 1
    assert gpu.labelled["throttle_active"][("hw_slowdown",)] == 0
    assert gpu.labelled["throttle_seconds"][("sw_power_cap",)] == 12500000000
    assert gpu.labelled["ecc_errors"][("corrected", "aggregate")] == 41
    assert len(gpu.labelled["nvlink_up"]) == 18 and gpu.nvlink_links == 18
    # GPM's PCIe rates (MiB/s) in the sampler's unit, KB/s; the byte counters are for GPUs without them
    assert gpu.labelled["pcie_throughput"] == {("tx",): 1250000, ("rx",): 2500000}
    assert "pcie_bytes" not in gpu.labelled
    assert gpu.labelled["pcie_errors"] == {("correctable",): 0, ("non_fatal",): 0, ("fatal",): 0}
    assert "pcie_link_events" not in gpu.labelled  # detail=all
    assert [p.pid for p in gpu.processes] == [4106]
    assert "fan_speed" not in gpu.scalars  # SXM: no fan, so no value (not 0)
    assert "retired_pages" not in gpu.labelled and "retired_pages_pending" not in gpu.scalars  # rows remap instead
    source.close()


def test_gpm_needs_two_samples_and_reports_percent(scenario) -> None:
    fake = scenario("h100_8x_healthy")
    source = NvmlSource()
    assert "sm_active" not in by_index(source.read())[0].scalars
    fake.gpu(0).set(gpm={"sm_active": 12.5})
    gpu = by_index(source.read())[0]
    assert gpu.scalars["sm_active"] == 12.5 and gpu.scalars["dram_active"] == 25.5
    source.close()
    assert fake.initialized == 0


def test_a100_has_no_gpm_and_twelve_links(scenario) -> None:
    scenario("a100_8x")
    source = NvmlSource()
    source.read()
    gpu = by_index(source.read())[1]
    assert "sm_active" not in gpu.scalars and gpu.nvlink_links == 12
    assert gpu.identity.pci_bus_id == "00000000:10:1D.0"
    source.close()


def test_older_driver_falls_back_to_older_calls(scenario) -> None:
    fake = scenario("older_driver")
    source = NvmlSource()
    gpu = by_index(source.read())[0]
    assert gpu.scalars["temperature"] == 52  # nvmlDeviceGetTemperature instead of ...V
    assert gpu.labelled["throttle_active"][("sw_power_cap",)] == 1  # ...ThrottleReasons instead of ...EventReasons
    assert gpu.scalars["memory_total"] == 85520809984 and "memory_reserved" not in gpu.scalars  # v1 memory info
    assert [p.pid for p in gpu.processes] == [4101]  # _v2 process list
    assert "recovery_action" not in gpu.scalars and ("hw_thermal",) not in gpu.labelled["throttle_seconds"]
    assert gpu.labelled["throttle_seconds"][("sw_power_cap",)] == 12500000000  # an old field still answers
    before = dict(fake.calls)
    source.read()
    # The missing symbol is remembered: the fallback is called directly from then on.
    assert fake.calls["nvmlDeviceGetTemperature"] - before["nvmlDeviceGetTemperature"] == 8
    source.close()


def test_unsupported_values_are_absent_and_quiet(scenario, caplog) -> None:
    scenario("unsupported_fields")
    source = NvmlSource()
    with caplog.at_level(logging.DEBUG, logger="fleetscope.sources.nvml"):
        gpu = by_index(source.read())[2]
        source.read()
    for key in ("memory_temperature", "energy", "performance_state", "recovery_action", "power_limit", "pcie_replays"):
        assert key not in gpu.scalars
    assert "ecc_errors" not in gpu.labelled and "pcie_throughput" not in gpu.labelled
    assert gpu.scalars["power"] == 692345  # the rest still reports
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # Each unsupported value is mentioned once per GPU, not on every collection.
    messages = [r.getMessage() for r in caplog.records if "gpu 2: power_limit" in r.getMessage()]
    assert len(messages) == 1
    source.close()


def test_mig_gpus_omit_utilization_and_row_remapping(scenario) -> None:
    scenario("mig_enabled")
    gpus = by_index(NvmlSource().read())
    assert gpus[0].identity.mig_mode == "enabled" and "utilization" not in gpus[0].scalars
    assert "row_remap_pending" not in gpus[0].scalars and "remapped_rows" not in gpus[0].labelled
    assert gpus[4].scalars["utilization"] == 97 and gpus[4].scalars["row_remap_pending"] == 0


def test_without_field_values_the_per_call_fallbacks_answer(scenario) -> None:
    fake = scenario("h100_8x_healthy")
    fake.missing_functions.add("nvmlDeviceGetFieldValues")
    gpu = by_index(NvmlSource().read())[0]
    assert gpu.scalars["energy"] == 987654321 and gpu.scalars["pcie_replays"] == 7
    assert gpu.labelled["remapped_rows"][("correctable",)] == 2
    assert gpu.labelled["ecc_errors"][("corrected", "aggregate")] == 41


def test_nvlink_down_and_errors_per_link(scenario) -> None:
    fake = scenario("h100_8x_healthy")
    fake.gpu(6).nvlink_up[4] = False
    fake.gpu(6).nvlink_errors["crc"][4] = 17
    fake.gpu(6).nvlink_errors["crc"][9] = 3
    gpu = by_index(NvmlSource(per_link=True).read())[6]
    assert gpu.labelled["nvlink_up"][("4",)] == 0 and gpu.labelled["nvlink_up"][("5",)] == 1
    assert gpu.labelled["nvlink_errors"][("4", "crc")] == 17 and gpu.labelled["nvlink_errors"][("9", "crc")] == 3
    # The default level exports the GPU's sum over its links: NVML's all-link totals, 4 fields instead of 54.
    before = dict(fake.fields_asked)
    gpu = by_index(NvmlSource().read())[6]
    assert gpu.labelled["nvlink_errors"] == {("", "crc"): 20, ("", "replay"): 0, ("", "recovery"): 0}
    asked = {f: n - before.get(f, 0) for f, n in fake.fields_asked.items() if n > before.get(f, 0)}
    assert 161 not in asked and asked[52] == 8 and asked[165] == 8 * 18


def test_nvlink_per_link_counters_where_the_driver_has_no_totals(scenario) -> None:
    fake = scenario("h100_8x_healthy")
    for gpu in fake.gpus:
        gpu.errors.update({f"field:{f}": NvmlReturn.named("NVML_ERROR_NOT_SUPPORTED") for f in (38, 45, 52, 59)})
    fake.gpu(2).nvlink_errors["replay"][1] = 5
    gpu = by_index(NvmlSource().read())[2]
    assert gpu.labelled["nvlink_errors"][("1", "replay")] == 5 and len(gpu.labelled["nvlink_errors"]) == 54


def test_lost_gpu_is_isolated_and_retried_after_the_interval(scenario) -> None:
    fake = scenario("h100_8x_healthy")
    now = [1000.0]
    source = NvmlSource(lost_retry=60, clock=lambda: now[0])
    source.read()
    fake.lose(3)
    reading = source.read()
    assert sorted(by_index(reading)) == [0, 1, 2, 4, 5, 6, 7]
    assert [(g.index, g.uuid) for g in reading.lost] == [(3, fake.gpu(3).uuid)]
    fake.recover(3)
    now[0] += 30
    assert [g.index for g in source.read().lost] == [3]  # not retried before lost_retry
    now[0] += 31
    reading = source.read()
    assert reading.lost == () and 3 in by_index(reading)


def test_gpu_lost_from_the_start_has_no_identity_yet(scenario) -> None:
    scenario("lost_gpu")
    reading = NvmlSource().read()
    assert [(g.index, g.uuid) for g in reading.lost] == [(3, "")]
    assert len(reading.samples) == 7


def test_no_library_is_no_hardware() -> None:
    uninstall()
    with pytest.raises(NoHardware, match="NVML"):
        NvmlSource().read()


def test_event_watcher_delivers_xids_and_survives_a_lost_gpu(scenario) -> None:
    fake = scenario("xid_events")
    seen: list[XidSighting] = []
    arrived = threading.Condition()

    def on_xid(sighting: XidSighting) -> None:
        with arrived:
            seen.append(sighting)
            arrived.notify_all()

    source = NvmlSource(on_xid=on_xid)
    source.read()
    with arrived:
        assert arrived.wait_for(lambda: len(seen) >= 4, timeout=240)  # a hang guard
    assert sorted((s.pci.bus, s.xid) for s in seen) == [(0x53, 13), (0x53, 13), (0x75, 48), (0xA8, 79)]
    assert {s.source for s in seen} == {"nvml"}
    fake.lose(3)
    source.read()
    # The watcher re-registers without the lost GPU and keeps delivering for the others.
    with arrived:
        fake.inject_xid(5, 119)
        if not arrived.wait_for(lambda: len(seen) >= 5, timeout=2):
            fake.inject_xid(5, 119)  # sent while the set was being re-created: send again
            assert arrived.wait_for(lambda: len(seen) >= 5, timeout=240)
    assert (seen[4].pci.bus, seen[4].xid) == (0xA8, 119)
    source.close()
