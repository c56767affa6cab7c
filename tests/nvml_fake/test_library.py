"""The NVML fake as pynvml sees it: real return codes, real structs, scenario files, runtime control."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pynvml
import pytest

from fleetscope_sim.nvml_fake import (
    FakeGpu,
    FakeNvml,
    NvmlReturn,
    install,
    installed,
    load_scenario,
    scenario_names,
    uninstall,
)


@pytest.fixture(autouse=True)
def no_library_left() -> Iterator[None]:
    yield
    uninstall()


def test_the_fake_takes_the_native_librarys_place_in_pynvml() -> None:
    """The contract with pynvml's internals (set_native_library): its library slot, lock, symbol cache, refcount."""
    assert isinstance(pynvml._nvmlGetFunctionPointer_cache, dict) and isinstance(pynvml._nvmlLib_refcount, int)
    assert hasattr(pynvml.libLoadLock, "acquire")
    fake = FakeNvml([FakeGpu()])
    install(fake)
    assert pynvml.nvmlLib is fake
    pynvml.nvmlInit()
    assert pynvml._nvmlLib_refcount == 1 and "nvmlDeviceGetCount_v2" not in pynvml._nvmlGetFunctionPointer_cache
    assert pynvml.nvmlDeviceGetCount() == 1 and "nvmlDeviceGetCount_v2" in pynvml._nvmlGetFunctionPointer_cache
    pynvml.nvmlShutdown()
    uninstall()
    assert pynvml.nvmlLib is None and pynvml._nvmlGetFunctionPointer_cache == {}


def test_every_scenario_loads_with_unique_identities() -> None:
    assert {"h100_8x_healthy", "a100_8x", "mig_enabled", "lost_gpu", "xid_events", "hanging_call", "older_driver",
            "unsupported_fields"} <= set(scenario_names())
    for name in scenario_names():
        fake = load_scenario(name)
        assert len(fake.gpus) == 8
        assert len({g.uuid for g in fake.gpus}) == 8 and len({g.bus_id for g in fake.gpus}) == 8
        fake.release()


def test_base_scenario_overrides_merge_per_gpu() -> None:
    fake = load_scenario("xid_events")
    assert fake.gpu(2).ecc == {"corrected_volatile": 3, "uncorrected_volatile": 1, "corrected_aggregate": 41,
                               "uncorrected_aggregate": 1}
    assert fake.gpu(2).processes == [[4103, 70000000000]]  # kept from the base scenario
    fake.gpu(2).nvlink_up[0] = False
    assert fake.gpu(3).nvlink_up[0] is True  # no state shared between GPUs


def test_set_rejects_unknown_fields() -> None:
    gpu = FakeGpu()
    gpu.set(temperature=80, clocks_mhz={"sm": 900})
    assert gpu.temperature == 80 and gpu.clocks_mhz == {"sm": 900, "memory": 2619, "graphics": 1980}
    with pytest.raises(AttributeError):
        gpu.set(temprature=80)
    gpu.throttle("hw_thermal", "sw_power_cap")
    assert gpu.throttle_reasons == 0x44


def test_calls_before_init_are_uninitialized() -> None:
    install(FakeNvml([FakeGpu()]))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_real_error_classes_and_strings() -> None:
    fake = load_scenario("unsupported_fields")
    with installed(fake):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported) as unsupported:
            pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)
        assert str(unsupported.value) == "Not Supported"
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(8)
        fake.lose(0)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetName(handle)
        pynvml.nvmlShutdown()


def test_missing_symbol_is_function_not_found() -> None:
    with installed(load_scenario("older_driver")):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) == 0x4


def test_sized_calls_follow_the_two_call_protocol() -> None:
    fake = load_scenario("h100_8x_healthy")
    fake.gpu(0).processes = [(11, 1 << 30), (12, 2 << 30), (13, 3 << 30)]
    with installed(fake):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [(11, 1 << 30), (12, 2 << 30), (13, 3 << 30)]
        fake.gpu(0).processes = []
        assert pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle) == []


def test_field_values_answer_per_field() -> None:
    with installed(load_scenario("older_driver")):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        values = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP,
                                                          pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
                                                          (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 17)])
        assert [v.nvmlReturn for v in values] == [pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED,
                                                  pynvml.NVML_SUCCESS]
        assert values[0].value.ullVal == 61 and values[2].scopeId == 17 and values[2].value.uiVal == 1


def test_hanging_call_blocks_until_released() -> None:
    fake = load_scenario("hanging_call")
    with installed(fake):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        result: list[int] = []
        worker = threading.Thread(target=lambda: result.append(pynvml.nvmlDeviceGetPowerUsage(handle)), daemon=True)
        worker.start()
        worker.join(0.2)
        assert worker.is_alive() and result == []
        fake.release()
        worker.join(240)  # a hang guard only
        assert result == [692345]


def test_events_only_after_registration_and_for_registered_types() -> None:
    fake = load_scenario("h100_8x_healthy")
    fake.gpu(1).set(supported_events=0xC0B)  # ECC, Xid, retirement: no clock-change events
    with installed(fake):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(1)
        fake.inject_xid(1, 31)  # before registration: lost, as with the real NVML
        event_set = pynvml.nvmlEventSetCreate()
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeClock, event_set)
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(event_set, 10)
        fake.inject_xid(1, 79)
        data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
        assert (pynvml.nvmlDeviceGetIndex(data.device), data.eventType, data.eventData) == (1, 0x8, 79)
        assert data.gpuInstanceId == 0xFFFFFFFF
        fake.lose(1)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlEventSetWait_v2(event_set, 1000)
        pynvml.nvmlEventSetFree(event_set)


def test_uninstall_returns_to_no_library() -> None:
    install(load_scenario("a100_8x"))
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA A100-SXM4-40GB"
    uninstall()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()


def test_any_return_code_can_stand_where_a_value_would(tmp_path) -> None:
    scenario = tmp_path / "codes.yaml"
    scenario.write_text(
        "base: h100_8x_healthy\n"
        "defaults:\n"
        "  power_mw: NVML_ERROR_NO_PERMISSION\n"
        "  clocks_mhz: {memory: NVML_ERROR_UNKNOWN}\n"
        "  gpm: {tensor_active: NVML_ERROR_NOT_SUPPORTED}\n"
        "  errors: {field:83: NVML_ERROR_NO_PERMISSION}\n"
        "gpus:\n"
        "  7: {errors: {nvmlDeviceGetHandleByIndex_v2: NVML_ERROR_INSUFFICIENT_POWER}}\n"
    )
    fake = load_scenario(str(scenario))
    assert fake.gpu(0).power_mw == NvmlReturn.named("NVML_ERROR_NO_PERMISSION")
    with installed(fake):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NoPermission) as refused:
            pynvml.nvmlDeviceGetPowerUsage(handle)
        assert str(refused.value) == "Insufficient Permissions"
        assert pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1320
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        # the energy field is refused while the older call still answers
        (energy,) = pynvml.nvmlDeviceGetFieldValues(handle, [83])
        assert energy.nvmlReturn == pynvml.NVML_ERROR_NO_PERMISSION
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) == 987654321
        with pytest.raises(pynvml.NVMLError_InsufficientPower):
            pynvml.nvmlDeviceGetHandleByIndex(7)
        pynvml.nvmlShutdown()


def test_init_error_is_what_nvml_init_raises() -> None:
    install(FakeNvml([], init_error=NvmlReturn.named("NVML_ERROR_DRIVER_NOT_LOADED")))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


def test_return_code_names_are_the_binding_s() -> None:
    from fleetscope.sources.nvml_h import RETURN_CODES

    named = {name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith("NVML_ERROR_")}
    for code, (name, _) in RETURN_CODES.items():
        if code:
            assert named[name] == code and NvmlReturn.named(name) == NvmlReturn(code)
    with pytest.raises(ValueError, match="not an NVML return code"):
        NvmlReturn.named("NVML_ERROR_NO_SUCH_THING")


def test_a_latency_model_books_what_each_call_costs_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = load_scenario("h100_8x_healthy")
    slept: list[float] = []  # virtual: the model books its costs, it never sleeps them
    monkeypatch.setattr(time, "sleep", slept.append)
    assert fake.latency is not None and fake.latency.name == "h100_sxm_580"
    with installed(fake):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        before = fake.booked().modelled_seconds
        pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)  # the first call: 1,980 µs
        pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)  # then 1,724 µs
        # each field its own figure: ECC 7.7 µs, energy 3,446.4 µs, an NVLink state (no figure of its own)
        # 232.5 µs, retired pages refused 6.4 µs; NVML's latencyUsec says the same
        values = pynvml.nvmlDeviceGetFieldValues(handle, [3, 83, (165, 0), 29])
        assert [v.latencyUsec for v in values] == [8, 3446, 232, 6]
        assert [v.nvmlReturn for v in values] == [0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetFanSpeed(handle)  # refused, and it costs what the real refusal cost
        booked = fake.booked().modelled_seconds - before
        assert booked == pytest.approx((1980 + 1724.2 + 7.7 + 3446.4 + 232.5 + 6.4 + 615) / 1e6)
        assert slept == []  # virtual: nothing slept
        other: list[float] = []
        worker = threading.Thread(target=lambda: other.append(
            pynvml.nvmlDeviceGetPowerUsage(handle) and fake.booked().modelled_seconds))
        worker.start()
        worker.join(240)  # a hang guard only
        assert other == [pytest.approx(1024 / 1e6)]  # each thread's calls are its own
        assert fake.fields_asked[83] == 1 and fake.booked().own_seconds > 0
        pynvml.nvmlShutdown()


def test_latency_models_by_name_inline_and_from_a_capture() -> None:
    from fleetscope_sim.nvml_fake import LatencyModel

    assert LatencyModel.of({"calls_us": {"nvmlDeviceGetPowerUsage": 7}, "default_us": 2}).call_us("x") == 2
    with pytest.raises(ValueError, match="no latency model 'h100_nvl'"):
        LatencyModel.named("h100_nvl")
    with pytest.raises(ValueError, match="unknown keys"):
        LatencyModel.from_data({"field": 3})
    captured = LatencyModel.from_capture({"nvmlDeviceGetFieldValues": {"calls": 1, "ms": 5.525},
                                         "nvmlDeviceGetClockInfo": {"calls": 3, "ms": 0.52}})
    assert captured.cost_us("nvmlDeviceGetFieldValues", fields=[(83, True)] * 21) == pytest.approx(5525)
    assert captured.call_us("nvmlDeviceGetClockInfo") == pytest.approx(173.3, abs=0.1)
    per_field = LatencyModel.of({"fields_us": {83: 3000}, "field_us": 200})
    assert per_field.cost_us("nvmlDeviceGetFieldValues", fields=[(83, True), (3, True), (29, False)]) == 3400
    assert LatencyModel.of({"field_us": 200, "refused_field_us": 5}).field_cost_us(83, answered=False) == 5


def test_new_fields_gpm_pcie_rates_and_nvlink_totals() -> None:
    fake = load_scenario("h100_8x_healthy")
    fake.gpu(0).nvlink_errors["replay"][3] = 4
    fake.gpu(0).nvlink_errors["replay"][7] = 1
    fake.gpu(0).set(pcie_errors={"correctable": 12})
    with installed(fake):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        values = pynvml.nvmlDeviceGetFieldValues(handle, [52, 45, 173, 180, 197])
        assert [v.value.ullVal for v in values] == [5, 0, 12, 0, 1823554560000]
        fake.gpu(0).set(nvlink_up=[], nvlink_errors={"replay": [], "recovery": [], "crc": []})
        (total,) = pynvml.nvmlDeviceGetFieldValues(handle, [52])
        assert total.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # no links, no totals
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, first)
        pynvml.nvmlGpmSampleGet(handle, second)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version, request.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 2
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId, request.metrics[1].metricId = 20, 21  # PCIe TX/RX, MiB/s
        result = pynvml.nvmlGpmMetricsGet(request)
        assert [result.metrics[i].value for i in range(2)] == [1250000 / 1024, 2500000 / 1024]
        pynvml.nvmlShutdown()


def test_a_gpu_reset_and_a_driver_reload() -> None:
    fake = load_scenario("h100_8x_healthy")
    fake.reset_gpu(2, power_limit_mw=650000)
    gpu = fake.gpu(2)
    assert (gpu.energy_mj, gpu.ecc["uncorrected_volatile"], gpu.ecc["corrected_aggregate"]) == (0, 0, 41)  # type: ignore[index]
    assert gpu.power_limit_mw == 650000 and gpu.throttle_ns["sw_power_cap"] == 0
    assert fake.gpu(3).energy_mj == 987654321
    with installed(fake):
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(3)
        fake.reload_driver()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetPowerUsage(handle)
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) == 0
        pynvml.nvmlShutdown()
