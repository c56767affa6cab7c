"""NVIDIA GPUs through NVML (``nvidia-ml-py``, module ``pynvml``, imported lazily).

Every NVML call is isolated: a value the GPU does not support is left out
(logged once at debug); a symbol the driver lacks (``FunctionNotFound``, a
driver older than the binding) makes the source fall back to the older call
and remember that; ``GPU_IS_LOST`` marks that one GPU lost (the others keep
reporting) and it is retried after ``lost_retry`` seconds; no library at all
is :class:`~fleetscope.errors.NoHardware`.

Most counters come from one batched ``nvmlDeviceGetFieldValues`` call per GPU
(ECC, retired pages, memory temperature, energy, PCIe replays, row remapping,
throttle durations, recovery action) plus one for the per-link NVLink fields.
GPM (Hopper+) ratios are computed between the sample taken at this collection
and the one kept from the previous collection, so no collection ever sleeps.

Values stay in NVML's units here (percent, mW, mJ, MHz, ns, KB/s), named by
:data:`NvmlValue`; the collector maps each name to its metric, whose ``scale``
turns it into base units.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from fleetscope.errors import NoHardware
from fleetscope.sources.nvml_h import (
    ARCHITECTURES,
    CLOCK_TYPES,
    EVENT_XID,
    FI_DEV_ECC_SBE_VOL_TOTAL,
    FI_DEV_NVLINK_GET_STATE,
    FI_DEV_NVLINK_LINK_COUNT,
    FI_DEV_PCIE_REPLAY_COUNTER,
    FI_DEV_REMAPPED_COR,
    FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    GPM_METRICS,
    GPU_FIELDS,
    LINK_FIELDS,
    THROTTLE_BITS,
    WATCHED_EVENTS,
)
from fleetscope.sources.xid import PciAddress, XidSighting

logger = logging.getLogger(__name__)

# The values one GPU's reading can hold (in NVML's units).
NvmlValue = Literal[
    "utilization", "memory_utilization", "memory_used", "memory_free", "memory_total", "memory_reserved",
    "temperature", "memory_temperature", "slowdown_temperature", "shutdown_temperature", "power", "power_limit",
    "energy", "clock", "clock_max", "throttle_active", "throttle_seconds", "ecc_errors", "retired_pages",
    "retired_pages_pending", "remapped_rows", "row_remap_pending", "row_remap_failed", "pcie_replays",
    "pcie_generation", "pcie_max_generation", "pcie_width", "pcie_max_width", "pcie_throughput", "nvlink_up",
    "nvlink_errors", "performance_state", "fan_speed", "recovery_action", "processes", "process_memory",
    "sm_active", "sm_occupancy", "tensor_active", "dram_active",
]

# (error_type, counter_type) -> nvmlDeviceGetTotalEccErrors arguments, when field values are unavailable.
ECC_COUNTERS = {("corrected", "volatile"): (0, 0), ("uncorrected", "volatile"): (1, 0),
                ("corrected", "aggregate"): (0, 1), ("uncorrected", "aggregate"): (1, 1)}
EVENT_WAIT_MS = 500


class Put(Protocol):
    """Records one value of the GPU being read (``None``: not read, left out)."""

    def __call__(self, key: NvmlValue, value: Any, labels: tuple[str, ...] = ()) -> None: ...


class GpuLost(Exception):
    """NVML answered GPU_IS_LOST for this GPU."""


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str = ""
    name: str = ""
    serial: str = ""
    pci_bus_id: str = ""
    pci: PciAddress | None = None
    vbios_version: str = ""
    mig_mode: str = ""
    architecture: str = ""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class GpuSample:
    """One GPU's reading: value name -> raw value, and labelled values keyed by their extra labels."""

    identity: GpuIdentity
    scalars: Mapping[NvmlValue, float] = field(default_factory=dict)
    labelled: Mapping[NvmlValue, Mapping[tuple[str, ...], float]] = field(default_factory=dict)
    processes: tuple[GpuProcess, ...] = ()
    nvlink_links: int = 0


@dataclass(frozen=True)
class NvmlReading:
    driver_version: str
    nvml_version: str
    device_count: int
    samples: tuple[GpuSample, ...]
    lost: tuple[GpuIdentity, ...]


class NvmlSource:
    """Owns the NVML session, the per-GPU state (handles, lost GPUs, GPM samples) and the event watcher."""

    def __init__(self, lost_retry: float = 60.0, on_xid: Callable[[XidSighting], object] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lost_retry = lost_retry
        self._on_xid = on_xid
        self._clock = clock
        self._nvml: Any = None
        self._lock = threading.Lock()
        self._identities: dict[int, GpuIdentity] = {}
        self._handles: dict[int, Any] = {}
        self._lost_since: dict[int, float] = {}
        self._missing: set[str] = set()  # wrappers whose symbol the driver lacks
        self._quiet: set[tuple[int, str]] = set()  # (gpu, call) already logged as unsupported/failing
        self._gpm_supported: dict[int, bool] = {}
        self._gpm_previous: dict[int, Any] = {}
        self._nvlink_links: dict[int, int] = {}
        self._versions = ("", "")
        self._watcher: EventWatcher | None = None

    # -- session -----------------------------------------------------------------------------------

    def _open(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        try:
            import pynvml  # type: ignore[import-untyped]  # lazy: nodes without the collector never load it
        except ImportError as exc:
            raise NoHardware(f"nvidia-ml-py is not installed: {exc}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoHardware(f"NVML unavailable: {exc}") from None
        self._nvml = pynvml
        driver = self._attempt(-1, "driver_version", pynvml.nvmlSystemGetDriverVersion) or ""
        nvml_version = self._attempt(-1, "nvml_version", pynvml.nvmlSystemGetNVMLVersion) or ""
        self._versions = (str(driver), str(nvml_version))
        return pynvml

    def close(self, wait: float = 2.0) -> None:
        """End the session; a read stuck in the driver holds the lock, and then the session is left open."""
        if not self._lock.acquire(timeout=wait):
            logger.warning("NVML: a call has not returned for %.0fs; leaving the NVML session open", wait)
            return
        try:
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None
            if self._nvml is not None:
                for sample in self._gpm_previous.values():
                    self._attempt(-1, "gpm_free", self._nvml.nvmlGpmSampleFree, sample)
                self._gpm_previous.clear()
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()
                self._nvml = None
        finally:
            self._lock.release()

    # -- isolated calls ----------------------------------------------------------------------------

    def _attempt(self, gpu: int, key: str, call: Callable[..., Any], *args: Any) -> Any:
        """One NVML call: its value, or None when unsupported/missing/failing. GPU_IS_LOST raises GpuLost."""
        nvml = self._nvml
        if key in self._missing:
            return None
        try:
            return call(*args)
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost(gpu) from None
        except nvml.NVMLError_FunctionNotFound:
            logger.debug("NVML: %s is not in this driver; falling back", key)
            self._missing.add(key)
        except nvml.NVMLError as exc:
            if (gpu, key) not in self._quiet:
                self._quiet.add((gpu, key))
                level = logging.DEBUG if isinstance(exc, nvml.NVMLError_NotSupported) else logging.WARNING
                logger.log(level, "NVML: gpu %s: %s: %s", gpu, key, exc)
        except Exception as exc:  # a binding/driver mismatch must cost one value, not the GPU
            if (gpu, key) not in self._quiet:
                self._quiet.add((gpu, key))
                logger.warning("NVML: gpu %s: %s: %s: %s", gpu, key, type(exc).__name__, exc)
        return None

    def _first(self, gpu: int, *alternatives: tuple[str, Callable[[], Any]]) -> Any:
        """Newest call first; an older one only when the newer symbol is missing from the driver."""
        for key, call in alternatives:
            if key in self._missing:
                continue
            value = self._attempt(gpu, key, call)
            if value is not None or key not in self._missing:
                return value
        return None

    # -- reading -----------------------------------------------------------------------------------

    def read(self) -> NvmlReading:
        with self._lock:
            nvml = self._open()
            try:
                count = nvml.nvmlDeviceGetCount()
            except nvml.NVMLError as exc:
                raise NoHardware(f"NVML cannot count GPUs: {exc}") from None
            samples: list[GpuSample] = []
            lost: list[GpuIdentity] = []
            now = self._clock()
            for index in range(count):
                since = self._lost_since.get(index)
                if since is not None and now - since < self.lost_retry:
                    lost.append(self._identities.get(index, GpuIdentity(index)))
                    continue
                try:
                    samples.append(self._read_gpu(index))
                    if since is not None:
                        logger.warning("NVML: gpu %d is back", index)
                    self._lost_since.pop(index, None)
                except GpuLost:
                    if since is None:
                        logger.error("NVML: gpu %d is lost (GPU_IS_LOST); retrying every %.0fs", index, self.lost_retry)
                    self._lost_since[index] = now
                    self._gpm_previous.pop(index, None)
                    lost.append(self._identities.get(index, GpuIdentity(index)))
            if self._on_xid is not None:
                # Started once handles and PCI addresses are known, so every event can be attributed;
                # a GPU back from being lost is watched again.
                if self._watcher is None:
                    self._watcher = EventWatcher(self, self._on_xid)
                self._watcher.sync()
            return NvmlReading(self._versions[0], self._versions[1], count, tuple(samples), tuple(lost))

    def lost_indices(self) -> set[int]:
        return set(self._lost_since)

    def identity(self, index: int) -> GpuIdentity | None:
        return self._identities.get(index)

    def handles(self) -> dict[int, Any]:
        return {i: h for i, h in self._handles.items() if i not in self._lost_since}

    def _identify(self, index: int, handle: Any) -> GpuIdentity:
        nvml = self._nvml
        uuid = self._attempt(index, "uuid", nvml.nvmlDeviceGetUUID, handle) or ""
        pci_info = self._attempt(index, "pci_info", nvml.nvmlDeviceGetPciInfo, handle)
        bus_id = pci_info.busId.decode() if pci_info is not None and isinstance(pci_info.busId, bytes) else (
            str(pci_info.busId) if pci_info is not None else "")
        mig = self._attempt(index, "mig_mode", nvml.nvmlDeviceGetMigMode, handle)
        arch = self._attempt(index, "architecture", nvml.nvmlDeviceGetArchitecture, handle)
        try:
            pci = PciAddress.parse(bus_id) if bus_id else None
        except ValueError:
            pci = None
        return GpuIdentity(
            index=index, uuid=str(uuid), name=str(self._attempt(index, "name", nvml.nvmlDeviceGetName, handle) or ""),
            serial=str(self._attempt(index, "serial", nvml.nvmlDeviceGetSerial, handle) or ""),
            pci_bus_id=bus_id, pci=pci,
            vbios_version=str(self._attempt(index, "vbios", nvml.nvmlDeviceGetVbiosVersion, handle) or ""),
            mig_mode="" if mig is None else ("enabled" if mig[0] else "disabled"),
            architecture="" if arch is None else ARCHITECTURES.get(int(arch), str(arch)),
        )

    def _read_gpu(self, index: int) -> GpuSample:
        nvml = self._nvml
        handle = self._handles.get(index)
        if handle is None or index in self._lost_since:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError_GpuIsLost:
                raise GpuLost(index) from None
            self._handles[index] = handle
        if index not in self._identities or index in self._lost_since:
            self._identities[index] = self._identify(index, handle)
        identity = self._identities[index]
        scalars: dict[NvmlValue, float] = {}
        labelled: dict[NvmlValue, dict[tuple[str, ...], float]] = {}

        def put(key: NvmlValue, value: Any, labels: tuple[str, ...] = ()) -> None:
            if value is None:
                return
            if labels:
                labelled.setdefault(key, {})[labels] = float(value)
            else:
                scalars[key] = float(value)

        def attempt(key: str, call: Callable[..., Any], *args: Any) -> Any:
            return self._attempt(index, key, call, handle, *args)

        util = attempt("utilization", nvml.nvmlDeviceGetUtilizationRates)
        if util is not None:
            put("utilization", util.gpu)
            put("memory_utilization", util.memory)
        memory = self._first(
            index,
            ("memory_v2", lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)),
            ("memory_v1", lambda: nvml.nvmlDeviceGetMemoryInfo(handle)),
        )
        if memory is not None:
            put("memory_total", memory.total)
            put("memory_free", memory.free)
            put("memory_used", memory.used)
            put("memory_reserved", getattr(memory, "reserved", None))
        put("temperature", self._first(
            index,
            ("temperature_v", lambda: nvml.nvmlDeviceGetTemperatureV(handle, nvml.NVML_TEMPERATURE_GPU)),
            ("temperature", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        ))
        put("slowdown_temperature", attempt("threshold_slowdown", nvml.nvmlDeviceGetTemperatureThreshold,
                                      nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
        put("shutdown_temperature", attempt("threshold_shutdown", nvml.nvmlDeviceGetTemperatureThreshold,
                                      nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN))
        put("power", attempt("power", nvml.nvmlDeviceGetPowerUsage))
        put("power_limit", attempt("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit))
        for clock, clock_type in CLOCK_TYPES.items():
            put("clock", attempt(f"clock_{clock}", nvml.nvmlDeviceGetClockInfo, clock_type), (clock,))
            put("clock_max", attempt(f"clock_max_{clock}", nvml.nvmlDeviceGetMaxClockInfo, clock_type), (clock,))
        reasons = self._first(
            index,
            ("clocks_event_reasons", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
            ("clocks_throttle_reasons", lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
        )
        if reasons is not None:
            for reason, bit in THROTTLE_BITS.items():
                put("throttle_active", 1 if int(reasons) & bit else 0, (reason,))
        simple: tuple[tuple[NvmlValue, Callable[..., Any]], ...] = (
            ("pcie_generation", nvml.nvmlDeviceGetCurrPcieLinkGeneration),
            ("pcie_max_generation", nvml.nvmlDeviceGetMaxPcieLinkGeneration),
            ("pcie_width", nvml.nvmlDeviceGetCurrPcieLinkWidth),
            ("pcie_max_width", nvml.nvmlDeviceGetMaxPcieLinkWidth),
            ("performance_state", nvml.nvmlDeviceGetPerformanceState),
            ("fan_speed", nvml.nvmlDeviceGetFanSpeed),
        )
        for key, call in simple:
            put(key, attempt(key, call))
        for way, counter in (("tx", nvml.NVML_PCIE_UTIL_TX_BYTES), ("rx", nvml.NVML_PCIE_UTIL_RX_BYTES)):
            put("pcie_throughput", attempt(f"pcie_{way}", nvml.nvmlDeviceGetPcieThroughput, counter), (way,))
        self._read_fields(index, handle, put)
        processes = self._first(
            index,
            ("processes_v3", lambda: nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)),
            ("processes_v2", lambda: nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)),
        )
        procs: tuple[GpuProcess, ...] = ()
        if processes is not None:
            procs = tuple(GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                          for p in processes)
            put("processes", len(procs))
            put("process_memory", sum(p.used_bytes or 0 for p in procs))
        self._read_gpm(index, handle, put)
        return GpuSample(identity, scalars, labelled, procs, self._nvlink_links.get(index, 0))

    def _field_values(self, index: int, handle: Any, ids: list[Any]) -> dict[tuple[int, int], float] | None:
        """Batched field values: (field, scope) -> value for those the GPU answered; None if the call is missing."""
        nvml = self._nvml
        values = self._attempt(index, "field_values", nvml.nvmlDeviceGetFieldValues, handle, ids)
        if values is None:
            return None if "field_values" in self._missing else {}
        out: dict[tuple[int, int], float] = {}
        for item in values:
            if item.nvmlReturn != nvml.NVML_SUCCESS:
                if (index, f"field {item.fieldId}") not in self._quiet:
                    self._quiet.add((index, f"field {item.fieldId}"))
                    logger.debug("NVML: gpu %d: field %d: %s", index, item.fieldId, nvml.NVMLError(item.nvmlReturn))
                continue
            out[(int(item.fieldId), int(item.scopeId))] = _field_value(item)
        return out

    def _read_fields(self, index: int, handle: Any, put: Put) -> None:
        nvml = self._nvml
        fields = self._field_values(index, handle, [entry.id for entry in GPU_FIELDS])
        if fields is None:
            fields = {}  # a driver without entry values: the per-call fallbacks below still answer
        for entry in GPU_FIELDS:
            if entry.value is not None:
                put(entry.value, fields.get((entry.id, 0)), entry.labels)
        if (FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0) not in fields:
            put("energy", self._attempt(index, "energy", nvml.nvmlDeviceGetTotalEnergyConsumption, handle))
        if (FI_DEV_ECC_SBE_VOL_TOTAL, 0) not in fields:
            for (error, counter), args in ECC_COUNTERS.items():
                put("ecc_errors", self._attempt(index, f"ecc_{error}_{counter}", nvml.nvmlDeviceGetTotalEccErrors,
                                                handle, *args), (error, counter))
        if (FI_DEV_PCIE_REPLAY_COUNTER, 0) not in fields:
            put("pcie_replays", self._attempt(index, "pcie_replays", nvml.nvmlDeviceGetPcieReplayCounter, handle))
        if (FI_DEV_REMAPPED_COR, 0) not in fields:
            rows = self._attempt(index, "remapped_rows", nvml.nvmlDeviceGetRemappedRows, handle)
            if rows is not None:
                put("remapped_rows", rows[0], ("correctable",))
                put("remapped_rows", rows[1], ("uncorrectable",))
                put("row_remap_pending", rows[2])
                put("row_remap_failed", rows[3])
        links = int(fields.get((FI_DEV_NVLINK_LINK_COUNT, 0), 0))
        if not links:
            return
        self._nvlink_links[index] = links
        per_link = [(entry.id, link) for link in range(links) for entry in LINK_FIELDS]
        link_fields = self._field_values(index, handle, per_link) or {}
        for link in range(links):
            for entry in LINK_FIELDS:
                value = link_fields.get((entry.id, link))
                if entry.id == FI_DEV_NVLINK_GET_STATE:
                    if value is None:
                        value = self._attempt(index, "nvlink_state", nvml.nvmlDeviceGetNvLinkState, handle, link)
                    value = None if value is None else (1 if value else 0)
                if entry.value is not None:
                    put(entry.value, value, (str(link), *entry.labels))

    def _read_gpm(self, index: int, handle: Any, put: Put) -> None:
        nvml = self._nvml
        if index not in self._gpm_supported:
            support = self._attempt(index, "gpm_support", nvml.nvmlGpmQueryDeviceSupport, handle)
            self._gpm_supported[index] = bool(support is not None and support.isSupportedDevice)
        if not self._gpm_supported[index]:
            return
        sample = self._attempt(index, "gpm_alloc", nvml.nvmlGpmSampleAlloc)
        if sample is None:
            return
        if self._attempt(index, "gpm_sample", nvml.nvmlGpmSampleGet, handle, sample) is None:
            self._attempt(index, "gpm_free", nvml.nvmlGpmSampleFree, sample)
            return
        previous = self._gpm_previous.get(index)
        self._gpm_previous[index] = sample
        if previous is None:
            return  # the first sample: ratios need two
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = previous, sample
        for slot, metric_id in enumerate(GPM_METRICS):
            request.metrics[slot].metricId = metric_id
        result = self._attempt(index, "gpm_metrics", nvml.nvmlGpmMetricsGet, request)
        self._attempt(index, "gpm_free", nvml.nvmlGpmSampleFree, previous)
        if result is None:
            return
        for slot, key in enumerate(GPM_METRICS.values()):
            metric = result.metrics[slot]
            if metric.nvmlReturn == nvml.NVML_SUCCESS:
                put(key, metric.value)


def _field_value(item: Any) -> float:
    kind = int(item.valueType)
    union = item.value
    return float({0: union.dVal, 1: union.uiVal, 2: union.ulVal, 3: union.ullVal, 4: union.sllVal,
                  5: union.siVal, 6: union.usVal}.get(kind, union.ullVal))


class EventWatcher:
    """NVML error events, one event set and one thread per GPU: Xids go to ``on_xid``.

    A wait on an event set answers GPU_IS_LOST as soon as any GPU registered in it falls off
    the bus, and freeing that set loses the events still queued in it: with one set for all GPUs,
    an Xid on GPU 3 at the moment GPU 6 was lost was never seen. With a set per GPU, a lost GPU
    ends only its own watch; :meth:`sync` (after every reading) watches it again once it is back.
    """

    def __init__(self, source: NvmlSource, on_xid: Callable[[XidSighting], object], retry: float = 1.0) -> None:
        self._source = source
        self._on_xid = on_xid
        self._retry = retry
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: dict[int, threading.Thread] = {}

    def start(self) -> None:
        self.sync()

    def sync(self) -> None:
        """Watch every GPU the source holds a handle for that is not watched yet (new or back)."""
        with self._lock:
            if self._stop.is_set():
                return
            for index, handle in self._source.handles().items():
                running = self._threads.get(index)
                if running is not None and running.is_alive():
                    continue
                thread = threading.Thread(target=self._run, args=(index, handle), name=f"nvml-events-{index}",
                                          daemon=True)
                self._threads[index] = thread
                thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            threads = list(self._threads.values())
        deadline = time.monotonic() + 2 * EVENT_WAIT_MS / 1000
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, index: int, handle: Any) -> None:
        while not self._stop.is_set():
            try:
                if self._watch_once(index, handle):
                    return
            except Exception as exc:  # the watcher must outlive any driver trouble
                logger.warning("NVML event watcher, gpu %d: %s; registering again", index, exc)
            self._stop.wait(self._retry)

    def _watch_once(self, index: int, handle: Any) -> bool:
        """Watch one GPU until stopped; True when its watch is over (lost, nothing to watch, no session)."""
        nvml = self._source._nvml
        if nvml is None:
            return True
        wanted = nvml.nvmlDeviceGetSupportedEventTypes(handle) & WATCHED_EVENTS
        if not wanted:
            return True
        event_set = nvml.nvmlEventSetCreate()
        try:
            nvml.nvmlDeviceRegisterEvents(handle, wanted, event_set)
            while not self._stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, EVENT_WAIT_MS)
                except nvml.NVMLError_Timeout:
                    continue
                except nvml.NVMLError_GpuIsLost:
                    logger.debug("NVML events: gpu %d is lost; its watch ends", index)
                    return True
                if data.eventType & EVENT_XID:
                    self._deliver(index, data)
            return True
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)

    def _deliver(self, index: int, data: Any) -> None:
        identity = self._source.identity(index)
        if identity is None or identity.pci is None:
            return
        self._on_xid(XidSighting(identity.pci, int(data.eventData), time.time(), "nvml"))
