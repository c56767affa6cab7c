"""NVML asked everything the GPU collector asks, each answer kept with its return code: a fake scenario.

The capture goes through the real ``pynvml`` binding, so the same code reads a real node and, in the
tests, the NVML fake installed below the binding. Every entry point the collector uses is called (the
older fallbacks too, so a replay still answers when a newer symbol is missing), each in a worker thread
with a time limit: a wedged driver call becomes the scenario's ``hang`` list instead of a wedged capture.
The result is a scenario in the fake's own format (``fleetscope_sim.nvml_fake.scenarios``): values in NVML's
units, ``NVML_ERROR_...`` names where the driver answered a code, ``missing_functions`` for symbols the
driver lacks, ``lost`` for GPUs that answered GPU_IS_LOST, ``pending_events`` for events seen meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetscope.sources.nvml import ECC_COUNTERS
from fleetscope.sources.nvml_h import (
    ARCHITECTURES,
    CLOCK_TYPES,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    ERROR_UNKNOWN,
    FI_DEV_NVLINK_GET_STATE,
    FI_DEV_NVLINK_LINK_COUNT,
    GPM_METRICS,
    GPM_NVLINK_MAX_LINKS,
    GPM_NVLINK_TOTAL,
    GPM_PCIE,
    GPU_FIELDS,
    LINK_FIELDS,
    NO_INSTANCE,
    WATCHED_EVENTS,
    NvmlReturn,
    gpm_nvlink_link_metrics,
)

SINGLE_VALUES = {  # C symbol -> FakeGpu attribute, for the getters that answer one integer
    "nvmlDeviceGetPowerUsage": "power_mw",
    "nvmlDeviceGetEnforcedPowerLimit": "power_limit_mw",
    "nvmlDeviceGetCurrPcieLinkGeneration": "pcie_generation",
    "nvmlDeviceGetMaxPcieLinkGeneration": "pcie_max_generation",
    "nvmlDeviceGetCurrPcieLinkWidth": "pcie_width",
    "nvmlDeviceGetMaxPcieLinkWidth": "pcie_max_width",
    "nvmlDeviceGetPerformanceState": "performance_state",
    "nvmlDeviceGetFanSpeed": "fan_percent",
    "nvmlDeviceGetSupportedEventTypes": "supported_events",
}
IDENTITY = {"nvmlDeviceGetName": "name", "nvmlDeviceGetUUID": "uuid", "nvmlDeviceGetSerial": "serial",
            "nvmlDeviceGetVbiosVersion": "vbios_version"}

# The GPM metrics asked, by the key the fake keeps each under: the collector's ratios, PCIe and NVLink rates (MiB/s;
# NVLink's per link, "nvlink_<direction>_<link>", are kept as FakeGpu.nvlink_mibps).
GPM_ASKED = {**GPM_METRICS, **{metric: f"pcie_{direction}" for metric, direction in GPM_PCIE.items()},
             **{metric: f"nvlink_{direction}" for metric, direction in GPM_NVLINK_TOTAL.items()},
             **{metric: f"nvlink_{direction}_{link}" for link in range(GPM_NVLINK_MAX_LINKS)
                for metric, direction in gpm_nvlink_link_metrics(link).items()}}


@dataclass(frozen=True)
class Reply:
    """One call's outcome: a value, or the return code it answered (``hung``: no answer in time)."""

    value: Any = None
    code: int = 0
    hung: bool = False

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.hung


class _Lost(Exception):
    """The GPU answered GPU_IS_LOST: nothing more is asked of it."""


@dataclass
class NvmlCapture:
    """What NVML answered: a scenario for the fake (original identities: the archive writer redacts them)."""

    scenario: dict[str, Any] | None
    error: str = ""
    calls: dict[str, list[float]] = field(default_factory=dict)  # C symbol -> [calls, seconds]
    problems: list[str] = field(default_factory=list)


class Asker:
    """Calls NVML entry points one at a time, each with a time limit; remembers missing and hung symbols."""

    def __init__(self, nvml: Any, timeout: float, deadline: float) -> None:
        self.nvml = nvml
        self.timeout = timeout
        self.deadline = deadline
        self.missing: set[str] = set()
        self.hung: set[str] = set()
        self.calls: dict[str, list[float]] = {}
        self.problems: list[str] = []

    def __call__(self, symbol: str, call: Callable[..., Any], *args: Any) -> Reply:
        if symbol in self.missing:
            return Reply(code=ERROR_FUNCTION_NOT_FOUND)
        if symbol in self.hung or time.monotonic() > self.deadline:
            return Reply(hung=True)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = call(*args)
            except self.nvml.NVMLError as exc:
                box["code"] = int(exc.value)
            except Exception as exc:  # a binding/driver mismatch costs one answer, not the capture
                box["problem"] = f"{symbol}: {type(exc).__name__}: {exc}"

        started = time.perf_counter()
        worker = threading.Thread(target=run, name=f"capture-{symbol}", daemon=True)
        worker.start()
        worker.join(self.timeout)
        spent = self.calls.setdefault(symbol, [0, 0.0])
        spent[0] += 1
        spent[1] += time.perf_counter() - started
        if worker.is_alive():
            self.hung.add(symbol)  # abandoned: a daemon thread stuck in the driver
            self.problems.append(f"{symbol} did not return within {self.timeout:.0f}s")
            return Reply(hung=True)
        if "problem" in box:
            self.problems.append(box["problem"])
            return Reply(code=ERROR_UNKNOWN)
        code = box.get("code", 0)
        if code == ERROR_FUNCTION_NOT_FOUND:
            self.missing.add(symbol)
        if code == ERROR_GPU_IS_LOST:
            raise _Lost
        return Reply(value=box.get("value"), code=code)


def status_name(reply: Reply) -> str:
    return NvmlReturn(ERROR_TIMEOUT if reply.hung else reply.code).name


class GpuRecord:
    """The fake's view of one GPU being filled from replies: values, codes, and per-entry-point overrides."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.mig_samples: dict[int, Any] = {}  # MIG GPU instance -> its first GPM sample

    def one(self, attr: str, reply: Reply, convert: Callable[[Any], Any] = int) -> None:
        self.fields[attr] = convert(reply.value) if reply.ok else status_name(reply)

    def keyed(self, attr: str, key: str, value: Any) -> None:
        self.fields.setdefault(attr, {})[key] = value

    def settle(self, answers: list[tuple[str, Reply | None]], convert: Callable[[Any], Any] = int) -> Any:
        """One value the fake keeps once but answers through several channels (a field and an older call):
        the first value given, else the first code; a channel that answered differently keeps its own code."""
        given = [(channel, reply) for channel, reply in answers if reply is not None and not reply.hung
                 and reply.code != ERROR_FUNCTION_NOT_FOUND]
        chosen: Any = NvmlReturn(ERROR_NOT_SUPPORTED).name
        for _, reply in given:
            if reply.ok:
                chosen = convert(reply.value)
                break
        else:
            if given:
                chosen = status_name(given[0][1])
        for channel, reply in given:
            if not reply.ok and status_name(reply) != chosen:
                self.errors[channel] = status_name(reply)
        return chosen


def capture_nvml(sysfs_gpus: list[tuple[int, int, int]] | None = None, timeout: float = 5.0,
                 gpm_interval: float = 1.0, event_wait: float = 0.5, budget: float = 120.0) -> NvmlCapture:
    """Ask NVML everything; ``sysfs_gpus`` (domain, bus, device of NVIDIA GPUs on the PCI bus, in order)
    places a GPU NVML cannot identify."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError as exc:
        return NvmlCapture(None, f"nvidia-ml-py is not installed: {exc}")
    asker = Asker(pynvml, timeout, time.monotonic() + budget)
    init = asker("nvmlInitWithFlags", pynvml.nvmlInit)
    if not init.ok:
        code = status_name(init)
        return NvmlCapture({"description": f"NVML unavailable ({code})", "init_error": code, "pci_buses": []},
                           f"NVML unavailable: {code}", asker.calls, asker.problems)
    try:
        return _capture(pynvml, asker, sysfs_gpus or [], gpm_interval, event_wait)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _capture(nvml: Any, ask: Asker, sysfs_gpus: list[tuple[int, int, int]], gpm_interval: float,
             event_wait: float) -> NvmlCapture:
    scenario: dict[str, Any] = {"description": ""}
    for key, symbol, call in (("driver_version", "nvmlSystemGetDriverVersion", nvml.nvmlSystemGetDriverVersion),
                              ("nvml_version", "nvmlSystemGetNVMLVersion", nvml.nvmlSystemGetNVMLVersion),
                              ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion",
                               nvml.nvmlSystemGetCudaDriverVersion)):
        reply = ask(symbol, call)
        if reply.ok:
            scenario[key] = str(reply.value) if key != "cuda_driver_version" else int(reply.value)
    count = ask("nvmlDeviceGetCount_v2", nvml.nvmlDeviceGetCount)
    if not count.ok:
        return NvmlCapture(None, f"NVML cannot count GPUs: {status_name(count)}", ask.calls, ask.problems)
    records: list[GpuRecord] = []
    handles: dict[int, Any] = {}
    gpm_first: dict[int, Any] = {}
    lost: list[int] = []
    for index in range(int(count.value)):
        record = GpuRecord()
        records.append(record)
        try:
            handle = ask("nvmlDeviceGetHandleByIndex_v2", nvml.nvmlDeviceGetHandleByIndex, index)
            if not handle.ok:
                record.errors["nvmlDeviceGetHandleByIndex_v2"] = status_name(handle)
                continue
            handles[index] = handle.value
            _probe(nvml, ask, record, handle.value)
            gpm_first[index] = _gpm_start(nvml, ask, record, handle.value)
        except _Lost:
            lost.append(index)
            handles.pop(index, None)
    if any(sample is not None for sample in gpm_first.values()):
        time.sleep(gpm_interval)  # GPM ratios describe the time between two samples
    for index, first in gpm_first.items():
        if first is not None and index in handles:
            try:
                _gpm_finish(nvml, ask, records[index], handles[index], first)
            except _Lost:
                lost.append(index)
    events = _pending_events(nvml, ask, handles, records, event_wait)
    gpus: dict[int, dict[str, Any]] = {}
    buses: list[int] = []
    for index, record in enumerate(records):
        fields = dict(record.fields)
        if index in lost or "pci_bus" not in fields:
            domain, bus, device = sysfs_gpus[index] if index < len(sysfs_gpus) else (0, 0, 0)
            fields.setdefault("pci_domain", domain)
            fields.setdefault("pci_bus", bus)
            fields.setdefault("pci_device", device)
        buses.append(int(fields.pop("pci_bus")))
        if record.errors:
            fields["errors"] = dict(sorted(record.errors.items()))
        gpus[index] = fields
    names = sorted({str(g.get("name")) for g in gpus.values() if g.get("name")})
    scenario["description"] = f"{len(gpus)}x {', '.join(names) or 'GPU'}, as fleetscope capture found them"
    scenario["max_field_id"] = 100_000  # every field's answer is explicit below
    scenario["missing_functions"] = sorted(ask.missing)
    scenario["hang"] = sorted(ask.hung)
    scenario["lost"] = sorted(set(lost))
    scenario["pending_events"] = events
    scenario["pci_buses"] = buses
    scenario.update(_common(gpus))
    return NvmlCapture(scenario, "", ask.calls, ask.problems)


def _probe(nvml: Any, ask: Asker, record: GpuRecord, handle: Any) -> None:
    for symbol, attr in IDENTITY.items():
        record.one(attr, ask(symbol, getattr(nvml, symbol), handle), str)
    pci = ask("nvmlDeviceGetPciInfo_v3", nvml.nvmlDeviceGetPciInfo, handle)
    if pci.ok:
        info = pci.value
        record.fields.update(pci_domain=int(info.domain), pci_bus=int(info.bus), pci_device=int(info.device),
                             pci_device_id=int(info.pciDeviceId))
    else:
        record.errors["nvmlDeviceGetPciInfo_v3"] = status_name(pci)
    record.one("mig_mode", ask("nvmlDeviceGetMigMode", nvml.nvmlDeviceGetMigMode, handle), lambda v: int(v[0]))
    record.one("architecture", ask("nvmlDeviceGetArchitecture", nvml.nvmlDeviceGetArchitecture, handle),
               lambda v: ARCHITECTURES.get(int(v), str(v)))
    _fabric(nvml, ask, record, handle)
    _mig(nvml, ask, record, handle)
    utilization = ask("nvmlDeviceGetUtilizationRates", nvml.nvmlDeviceGetUtilizationRates, handle)
    record.fields["utilization_gpu"] = int(utilization.value.gpu) if utilization.ok else status_name(utilization)
    record.fields["utilization_memory"] = int(utilization.value.memory) if utilization.ok else 0
    _memory(nvml, ask, record, handle)
    record.fields["temperature"] = record.settle([
        ("nvmlDeviceGetTemperatureV", ask("nvmlDeviceGetTemperatureV", nvml.nvmlDeviceGetTemperatureV, handle,
                                          nvml.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetTemperature", ask("nvmlDeviceGetTemperature", nvml.nvmlDeviceGetTemperature, handle,
                                         nvml.NVML_TEMPERATURE_GPU)),
    ])
    for attr, threshold in (("slowdown_temperature", nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                            ("shutdown_temperature", nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)):
        record.one(attr, ask("nvmlDeviceGetTemperatureThreshold", nvml.nvmlDeviceGetTemperatureThreshold, handle,
                             threshold))
    for symbol, attr in SINGLE_VALUES.items():
        record.one(attr, ask(symbol, getattr(nvml, symbol), handle))
    for clock, clock_type in CLOCK_TYPES.items():
        for attr, symbol in (("clocks_mhz", "nvmlDeviceGetClockInfo"), ("max_clocks_mhz", "nvmlDeviceGetMaxClockInfo")):
            reply = ask(symbol, getattr(nvml, symbol), handle, clock_type)
            record.keyed(attr, clock, int(reply.value) if reply.ok else status_name(reply))
    record.fields["throttle_reasons"] = record.settle([
        ("nvmlDeviceGetCurrentClocksEventReasons",
         ask("nvmlDeviceGetCurrentClocksEventReasons", nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)),
        ("nvmlDeviceGetCurrentClocksThrottleReasons",
         ask("nvmlDeviceGetCurrentClocksThrottleReasons", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)),
    ])
    for attr, counter in (("pcie_tx_kbps", nvml.NVML_PCIE_UTIL_TX_BYTES),
                          ("pcie_rx_kbps", nvml.NVML_PCIE_UTIL_RX_BYTES)):
        record.one(attr, ask("nvmlDeviceGetPcieThroughput", nvml.nvmlDeviceGetPcieThroughput, handle, counter))
    _fields(nvml, ask, record, handle)
    processes = ask("nvmlDeviceGetComputeRunningProcesses_v3", nvml.nvmlDeviceGetComputeRunningProcesses_v3, handle)
    older = ask("nvmlDeviceGetComputeRunningProcesses_v2", nvml.nvmlDeviceGetComputeRunningProcesses_v2, handle)
    listed = processes if processes.ok or processes.code != ERROR_FUNCTION_NOT_FOUND else older
    record.fields["processes"] = (
        [[int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory),
          *([int(p.gpuInstanceId)] if getattr(p, "gpuInstanceId", NO_INSTANCE) not in (None, NO_INSTANCE) else [])]
         for p in listed.value]
        if listed.ok else status_name(listed))
    if not older.ok and listed is not older and older.code not in (ERROR_FUNCTION_NOT_FOUND, listed.code):
        record.errors["nvmlDeviceGetComputeRunningProcesses_v2"] = status_name(older)


def _fabric(nvml: Any, ask: Asker, record: GpuRecord, handle: Any) -> None:
    """The NVLink fabric registration, as nvmlDeviceGetGpuFabricInfoV answers it (and the deprecated call)."""

    def versioned() -> Any:
        info = nvml.c_nvmlGpuFabricInfo_v2_t()
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        return info

    def first() -> Any:
        info = nvml.c_nvmlGpuFabricInfo_t()
        nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        return info

    replies: list[tuple[str, Reply | None]] = [
               ("nvmlDeviceGetGpuFabricInfoV", ask("nvmlDeviceGetGpuFabricInfoV", versioned)),
               ("nvmlDeviceGetGpuFabricInfo", ask("nvmlDeviceGetGpuFabricInfo", first))]
    answered = next((reply for _, reply in replies if reply is not None and reply.ok), None)
    if answered is None:
        record.fields["fabric"] = record.settle(replies)
        if record.fields["fabric"] == NvmlReturn(ERROR_NOT_SUPPORTED).name:
            record.fields["fabric"] = None
        return
    info = answered.value
    raw = bytes(info.clusterUuid).hex()
    fabric = {"state": int(info.state), "status": int(info.status), "clique_id": int(info.cliqueId),
              "cluster_uuid": "-".join((raw[:8], raw[8:12], raw[12:16], raw[16:20], raw[20:])) if int(raw, 16) else ""}
    if getattr(info, "healthMask", 0):
        fabric["health_mask"] = int(info.healthMask)
    record.fields["fabric"] = fabric
    for channel, reply in replies:
        if reply is not None and not reply.ok and reply.code != ERROR_FUNCTION_NOT_FOUND:
            record.errors[channel] = status_name(reply)


def _mig(nvml: Any, ask: Asker, record: GpuRecord, handle: Any) -> None:
    """MIG devices (while MIG is enabled): each slot's instance ids, UUID, name and memory."""
    record.one("max_mig_devices", ask("nvmlDeviceGetMaxMigDeviceCount", nvml.nvmlDeviceGetMaxMigDeviceCount, handle))
    count = record.fields["max_mig_devices"]
    if record.fields.get("mig_mode") != 1 or not isinstance(count, int):
        return
    devices: list[dict[str, Any]] = []
    for slot in range(count):
        mig = ask("nvmlDeviceGetMigDeviceHandleByIndex", nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if not mig.ok:
            continue
        device: dict[str, Any] = {"slot": slot}
        for key, symbol in (("gpu_instance", "nvmlDeviceGetGpuInstanceId"),
                            ("compute_instance", "nvmlDeviceGetComputeInstanceId")):
            reply = ask(symbol, getattr(nvml, symbol), mig.value)
            device[key] = int(reply.value) if reply.ok else 0
        for key, symbol in (("uuid", "nvmlDeviceGetUUID"), ("name", "nvmlDeviceGetName")):
            reply = ask(symbol, getattr(nvml, symbol), mig.value)
            if reply.ok:
                device[key] = str(reply.value)
        memory = ask("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo, mig.value)
        if memory.ok:
            device.update(memory_total=int(memory.value.total), memory_used=int(memory.value.used))
        devices.append(device)
    record.fields["mig_devices"] = devices


def _memory(nvml: Any, ask: Asker, record: GpuRecord, handle: Any) -> None:
    v2 = ask("nvmlDeviceGetMemoryInfo_v2", lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2))
    v1 = ask("nvmlDeviceGetMemoryInfo", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    if v2.ok:
        info = v2.value
        record.fields.update(memory_total=int(info.total), memory_used=int(info.used),
                             memory_reserved=int(info.reserved))
        if not v1.ok and v1.code != ERROR_FUNCTION_NOT_FOUND:
            record.errors["nvmlDeviceGetMemoryInfo"] = status_name(v1)
        return
    if v1.ok:  # v1 "used" counts the driver's reservation too: keep it all as used
        record.fields.update(memory_total=int(v1.value.total), memory_used=int(v1.value.used),
                             memory_reserved=status_name(v2) if v2.code != ERROR_FUNCTION_NOT_FOUND else None)
    else:
        record.fields.update(memory_total=0, memory_used=0, memory_reserved=None)
        if v1.code != ERROR_FUNCTION_NOT_FOUND:
            record.errors["nvmlDeviceGetMemoryInfo"] = status_name(v1)
    if v2.code != ERROR_FUNCTION_NOT_FOUND:
        record.errors["nvmlDeviceGetMemoryInfo_v2"] = status_name(v2)


def _field_replies(nvml: Any, ask: Asker, record: GpuRecord, handle: Any,
                   ids: list[Any]) -> dict[tuple[int, int], Reply]:
    """(field, scope) -> its reply; {} when the batch call itself failed (kept as that call's code)."""
    batch = ask("nvmlDeviceGetFieldValues", nvml.nvmlDeviceGetFieldValues, handle, ids)
    if not batch.ok:
        if batch.code != ERROR_FUNCTION_NOT_FOUND:
            record.errors["nvmlDeviceGetFieldValues"] = status_name(batch)
        return {}
    out: dict[tuple[int, int], Reply] = {}
    for item in batch.value:
        key = (int(item.fieldId), int(item.scopeId))
        if item.nvmlReturn != 0:
            out[key] = Reply(code=int(item.nvmlReturn))
        else:
            union = item.value
            kind = int(item.valueType)
            out[key] = Reply({0: union.dVal, 1: union.uiVal, 2: union.ulVal, 3: union.ullVal, 4: union.sllVal,
                              5: union.siVal, 6: union.usVal}.get(kind, union.ullVal))
    return out


def _fields(nvml: Any, ask: Asker, record: GpuRecord, handle: Any) -> None:
    fields = _field_replies(nvml, ask, record, handle, [entry.id for entry in GPU_FIELDS])
    fallbacks: dict[tuple[str, str | None], tuple[str, Reply]] = {
        ("energy_mj", None): ("nvmlDeviceGetTotalEnergyConsumption",
                              ask("nvmlDeviceGetTotalEnergyConsumption", nvml.nvmlDeviceGetTotalEnergyConsumption,
                                  handle)),
        ("pcie_replays", None): ("nvmlDeviceGetPcieReplayCounter",
                                 ask("nvmlDeviceGetPcieReplayCounter", nvml.nvmlDeviceGetPcieReplayCounter, handle)),
    }
    for (error, counter), args in ECC_COUNTERS.items():
        fallbacks[("ecc", f"{error}_{counter}")] = (
            "nvmlDeviceGetTotalEccErrors",
            ask("nvmlDeviceGetTotalEccErrors", nvml.nvmlDeviceGetTotalEccErrors, handle, *args))
    rows = ask("nvmlDeviceGetRemappedRows", nvml.nvmlDeviceGetRemappedRows, handle)
    for position, row in enumerate(("correctable", "uncorrectable", "pending", "failure")):
        fallbacks[("remapped_rows", row)] = (
            "nvmlDeviceGetRemappedRows", Reply(rows.value[position]) if rows.ok else rows)
    for entry in GPU_FIELDS:
        if entry.value is None:
            continue  # the link count: the fake answers it as the length of nvlink_up
        answers: list[tuple[str, Reply | None]] = [(f"field:{entry.id}", fields.get((entry.id, 0)))]
        if entry.home in fallbacks:
            answers.append(fallbacks[entry.home])
        value = record.settle(answers)
        attr, key = entry.home
        if key is None:
            record.fields[attr] = value
        else:
            record.keyed(attr, key, value)
    links_reply = fields.get((FI_DEV_NVLINK_LINK_COUNT, 0))
    links = int(links_reply.value) if links_reply is not None and links_reply.ok else 0
    if links_reply is not None and not links_reply.ok and links_reply.code != ERROR_NOT_SUPPORTED:
        record.errors[f"field:{FI_DEV_NVLINK_LINK_COUNT}"] = status_name(links_reply)
    link_ids = [(entry.id, link) for link in range(links) for entry in LINK_FIELDS]
    per_link = _field_replies(nvml, ask, record, handle, link_ids) if links else {}
    for entry in LINK_FIELDS:
        record.fields.setdefault(entry.home[0], [] if entry.home[1] is None else {})
        if entry.home[1] is not None:
            record.keyed(entry.home[0], entry.home[1], [])
    for link in range(links):
        for entry in LINK_FIELDS:
            answers = [(f"field:{entry.id}", per_link.get((entry.id, link)))]
            if entry.id == FI_DEV_NVLINK_GET_STATE:
                answers.append(("nvmlDeviceGetNvLinkState",
                                ask("nvmlDeviceGetNvLinkState", nvml.nvmlDeviceGetNvLinkState, handle, link)))
                value = record.settle(answers, convert=lambda v: bool(int(v)))
            else:
                value = record.settle(answers)
            attr, key = entry.home
            (record.fields[attr] if key is None else record.fields[attr][key]).append(value)


def _gpm_start(nvml: Any, ask: Asker, record: GpuRecord, handle: Any) -> Any:
    """The first GPM sample (None when the GPU has no GPM); the second comes after the interval."""
    support = ask("nvmlGpmQueryDeviceSupport", nvml.nvmlGpmQueryDeviceSupport, handle)
    if not support.ok:
        record.fields["gpm"] = None
        if support.code not in (ERROR_FUNCTION_NOT_FOUND, ERROR_NOT_SUPPORTED):
            record.errors["nvmlGpmQueryDeviceSupport"] = status_name(support)
        return None
    if not support.value.isSupportedDevice:
        record.fields["gpm"] = None
        return None
    sample = ask("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
    if not sample.ok:
        record.fields["gpm"] = status_name(sample)
        return None
    taken = ask("nvmlGpmSampleGet", nvml.nvmlGpmSampleGet, handle, sample.value)
    if not taken.ok:
        record.fields["gpm"] = status_name(taken)
        ask("nvmlGpmSampleFree", nvml.nvmlGpmSampleFree, sample.value)
        return None
    for device in record.fields.get("mig_devices") or []:  # each MIG GPU instance's own first sample
        gi = int(device["gpu_instance"])
        mig_sample = ask("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
        if not mig_sample.ok or gi in record.mig_samples:
            continue
        mig_taken = ask("nvmlGpmMigSampleGet", nvml.nvmlGpmMigSampleGet, handle, gi, mig_sample.value)
        if mig_taken.ok:
            record.mig_samples[gi] = mig_sample.value
        else:
            device["gpm"] = status_name(mig_taken)
            ask("nvmlGpmSampleFree", nvml.nvmlGpmSampleFree, mig_sample.value)
    return sample.value


def _mig_gpm_finish(nvml: Any, ask: Asker, record: GpuRecord, handle: Any) -> None:
    """Each MIG GPU instance's GPM ratios between its two samples, kept as its device's ``gpm``."""
    for device in record.fields.get("mig_devices") or []:
        first = record.mig_samples.pop(int(device["gpu_instance"]), None)
        if first is None:
            continue
        second = ask("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
        try:
            if not second.ok:
                continue
            taken = ask("nvmlGpmMigSampleGet", nvml.nvmlGpmMigSampleGet, handle, int(device["gpu_instance"]),
                        second.value)
            if not taken.ok:
                device["gpm"] = status_name(taken)
                continue
            device["gpm"] = _gpm_answers(nvml, ask, first, second.value, dict(GPM_METRICS))
        finally:
            ask("nvmlGpmSampleFree", nvml.nvmlGpmSampleFree, first)
            if second.ok:
                ask("nvmlGpmSampleFree", nvml.nvmlGpmSampleFree, second.value)


def _gpm_answers(nvml: Any, ask: Asker, first: Any, second: Any, asked: dict[int, str]) -> Any:
    """name -> value (or the code it answered) of the ``asked`` metrics between two samples; the call's code
    when it failed."""
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version = nvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(asked)
    request.sample1, request.sample2 = first, second
    for slot, metric_id in enumerate(asked):
        request.metrics[slot].metricId = metric_id
    result = ask("nvmlGpmMetricsGet", nvml.nvmlGpmMetricsGet, request)
    if not result.ok:
        return status_name(result)
    out: dict[str, Any] = {}
    for slot, name in enumerate(asked.values()):
        metric = result.value.metrics[slot]
        out[name] = float(metric.value) if metric.nvmlReturn == 0 else NvmlReturn(int(metric.nvmlReturn)).name
    return out


def _gpm_finish(nvml: Any, ask: Asker, record: GpuRecord, handle: Any, first: Any) -> None:
    second = ask("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
    try:
        if not second.ok:
            record.fields["gpm"] = status_name(second)
            return
        taken = ask("nvmlGpmSampleGet", nvml.nvmlGpmSampleGet, handle, second.value)
        if not taken.ok:
            record.fields["gpm"] = status_name(taken)
            return
        gpm = _gpm_answers(nvml, ask, first, second.value, GPM_ASKED)
        if not isinstance(gpm, dict):
            record.fields["gpm"] = gpm
            return
        _mig_gpm_finish(nvml, ask, record, handle)
        links = len(record.fields.get("nvlink_up") or [])
        rates: dict[str, list[Any]] = {"tx": [], "rx": []}
        for link in range(GPM_NVLINK_MAX_LINKS):  # per link: FakeGpu.nvlink_mibps, for the links the GPU has
            for direction in ("tx", "rx"):
                rate = gpm.pop(f"nvlink_{direction}_{link}")
                if link < links:
                    rates[direction].append(rate)
        if links:
            record.fields["nvlink_mibps"] = rates
        record.fields["gpm"] = gpm
    finally:
        ask("nvmlGpmSampleFree", nvml.nvmlGpmSampleFree, first)
        if second.ok:
            ask("nvmlGpmSampleFree", nvml.nvmlGpmSampleFree, second.value)


def _pending_events(nvml: Any, ask: Asker, handles: dict[int, Any], records: list[GpuRecord],
                    wait: float) -> list[dict[str, int]]:
    """Error events (Xids among them) the GPUs report while ``wait`` seconds pass, as the daemon registers."""
    event_set = ask("nvmlEventSetCreate", nvml.nvmlEventSetCreate)
    if not event_set.ok:
        return []
    events: list[dict[str, int]] = []
    try:
        registered = 0
        for index, handle in handles.items():
            supported = records[index].fields.get("supported_events")
            wanted = supported & WATCHED_EVENTS if isinstance(supported, int) else 0
            if not wanted:
                continue
            reply = ask("nvmlDeviceRegisterEvents", nvml.nvmlDeviceRegisterEvents, handle, wanted, event_set.value)
            if reply.ok:
                registered += 1
            else:
                records[index].errors["nvmlDeviceRegisterEvents"] = status_name(reply)
        deadline = time.monotonic() + wait
        while registered and time.monotonic() < deadline:
            remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
            data = ask("nvmlEventSetWait_v2", nvml.nvmlEventSetWait_v2, event_set.value, remaining_ms)
            if not data.ok:
                break  # NVML_ERROR_TIMEOUT: nothing happened
            source = next((i for i, h in handles.items() if _same_handle(h, data.value.device)), None)
            if source is not None:
                events.append({"gpu": source, "type": int(data.value.eventType), "xid": int(data.value.eventData)})
    except _Lost:
        pass
    finally:
        ask("nvmlEventSetFree", nvml.nvmlEventSetFree, event_set.value)
    return events


def _same_handle(a: Any, b: Any) -> bool:
    import ctypes

    return bool(ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value)


def _common(gpus: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``defaults`` (what every GPU shares) and ``gpus`` (the rest per GPU): the fake's scenario shape."""
    if not gpus:
        return {"defaults": {}, "gpus": {}}
    first = next(iter(gpus.values()))
    shared = {k: v for k, v in first.items() if all(k in g and g[k] == v for g in gpus.values())}
    return {"defaults": shared,
            "gpus": {i: {k: v for k, v in g.items() if k not in shared} for i, g in gpus.items()}}
