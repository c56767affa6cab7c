"""NVIDIA GPUs through NVML (``nvidia-ml-py``, module ``pynvml``, imported lazily).

Every NVML call is isolated: a value the GPU does not support is left out
(logged once at debug); a symbol the driver lacks (``FunctionNotFound``, a
driver older than the binding) makes the source fall back to the older call
and remember that; ``GPU_IS_LOST`` marks that one GPU lost (the others keep
reporting) and it is retried after ``lost_retry`` seconds; no library at all
is :class:`~fleetscope.errors.NoHardware`.

NVML costs time. On a real H100 (driver 580) ``nvmlDeviceGetMaxClockInfo`` costs
1.7 ms, ``nvmlDeviceGetPcieThroughput`` 21 ms (it samples a 20 ms window), most
other getters 2-150 µs. A field value costs what its source costs: 2-10 µs for
the counters the driver keeps (ECC, row remapping, recovery action), 0.1-0.3 ms
for each PCIe counter, 0.7-0.9 ms for the hardware throttle times and 3.5 ms for
energy (``nvmlDeviceGetTotalEnergyConsumption`` costs as much). So each value has
a cost class and is read only as often as its signal needs:

* ``constant``: identity, temperature thresholds, maximum clocks and PCIe link,
  NVLink link count, GPM support. Read once per GPU, and again when the GPU comes
  back from being lost, when a counter that only a GPU reset or a driver reload
  lowers goes down (energy, volatile ECC), or when the NVML session is reopened.
* ``fast``: gauges, every collection: utilization, memory, GPU temperature, power,
  clocks and their event reasons, the current PCIe link, performance state, fan,
  processes, GPM ratios and PCIe rates.
* ``slow``: counters, error states and every field value, every ``slow_interval``
  seconds per GPU, the GPUs spread over that interval, and at once after an NVML
  error event for the GPU (ECC, page retirement, recovery action): energy, throttle
  time, ECC, retired pages, row remapping, recovery action, power limit, HBM
  temperature, PCIe replays and errors, NVLink state and errors. Their alerts read
  them over windows of 5 minutes or more, or hold them for a minute or more
  (docs/runbooks.md).

A value answered NOT_SUPPORTED or NO_PERMISSION is not asked again for
``unsupported_retry`` seconds (a driver update may bring it). The batched field
values of one GPU are one ``nvmlDeviceGetFieldValues`` call per collection.
GPM (Hopper+) ratios and PCIe rates are computed between the sample taken at
this collection and the one kept from the previous collection, so no collection
ever sleeps; ``nvmlDeviceGetPcieThroughput`` (a 20 ms sample) is called only with
``pcie_sampler`` on, and only for a GPU without GPM.

Values stay in NVML's units here (percent, mW, mJ, MHz, ns, KB/s), named by
:data:`NvmlValue`; the collector maps each name to its metric, whose ``scale``
turns it into base units.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from fleetscope.errors import NoHardware
from fleetscope.sources.nvml_h import (
    ARCHITECTURES,
    CLOCK_TYPES,
    EVENT_XID,
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_NOT_SUPPORTED,
    FI_DEV_ECC_SBE_VOL_TOTAL,
    FI_DEV_NVLINK_GET_STATE,
    FI_DEV_NVLINK_LINK_COUNT,
    FI_DEV_PCIE_REPLAY_COUNTER,
    FI_DEV_REMAPPED_COR,
    FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    GPM_METRICS,
    GPM_NVLINK_MAX_LINKS,
    GPM_NVLINK_TOTAL,
    GPM_PCIE,
    GPU_FIELDS,
    LINK_FIELDS,
    NO_INSTANCE,
    NVLINK_BYTE_FIELDS,
    PCIE_BYTE_FIELDS,
    SCOPE_ALL_LINKS,
    THROTTLE_BITS,
    WATCHED_EVENTS,
    Field,
    gpm_nvlink_link_metrics,
)
from fleetscope.sources.xid import PciAddress, XidSighting

logger = logging.getLogger(__name__)

# The values one GPU's reading can hold (in NVML's units).
NvmlValue = Literal[
    "utilization", "memory_utilization", "memory_used", "memory_free", "memory_total", "memory_reserved",
    "temperature", "memory_temperature", "slowdown_temperature", "shutdown_temperature", "power", "power_limit",
    "energy", "clock", "clock_max", "throttle_active", "throttle_seconds", "ecc_errors", "retired_pages",
    "retired_pages_pending", "remapped_rows", "row_remap_pending", "row_remap_failed", "pcie_replays",
    "pcie_errors", "pcie_link_events", "pcie_bytes", "pcie_generation", "pcie_max_generation", "pcie_width",
    "pcie_max_width", "pcie_throughput", "nvlink_up", "nvlink_errors", "performance_state", "fan_speed",
    "recovery_action", "processes", "process_memory", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "fabric_state", "fabric_status", "nvlink_bytes", "mig_memory_used", "mig_memory_total", "mig_sm_active",
    "mig_sm_occupancy", "mig_tensor_active", "mig_dram_active",
]
# GPM's ratios of a whole GPU -> those of one of its MIG GPU instances (nvmlGpmMigSampleGet). Not GPM's graphics
# activity (NVML_GPM_METRIC_GRAPHICS_UTIL): on an H200 (driver 580) asking it made nvmlGpmMetricsGet 1.5 ms instead
# of 20 us (docs/benchmarks.md), so the GPU's activity stays NVML's utilization, and an instance's its SMs'.
MIG_GPM: dict[NvmlValue, NvmlValue] = {"sm_active": "mig_sm_active", "sm_occupancy": "mig_sm_occupancy",
                                       "tensor_active": "mig_tensor_active", "dram_active": "mig_dram_active"}
# (error_type, counter_type) -> nvmlDeviceGetTotalEccErrors arguments, when field values are unavailable.
ECC_COUNTERS = {("corrected", "volatile"): (0, 0), ("uncorrected", "volatile"): (1, 0),
                ("corrected", "aggregate"): (0, 1), ("uncorrected", "aggregate"): (1, 1)}
EVENT_WAIT_MS = 500
# Errors after which a value is not asked again for a while: the answer would be the same.
_LASTING = ("NVMLError_NotSupported", "NVMLError_NoPermission")
# Errors that say the NVML session itself is gone (the driver was reloaded under it): open it again.
_SESSION_GONE = ("NVMLError_Uninitialized", "NVMLError_DriverNotLoaded", "NVMLError_LibRmVersionMismatch")


class Put(Protocol):
    """Records one value of the GPU being read (``None``: not read, left out)."""

    def __call__(self, key: NvmlValue, value: Any, labels: tuple[str, ...] = ()) -> None: ...


class GpuLost(Exception):
    """NVML answered GPU_IS_LOST for this GPU."""


class _SessionGone(Exception):
    """NVML answered that it is not initialized (any more): the driver was reloaded."""


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
    gpu_instance: int | None = None  # the MIG GPU instance it runs in (None: the whole GPU)


@dataclass(frozen=True)
class FabricInfo:
    """The GPU in the NVLink fabric (nvmlDeviceGetGpuFabricInfoV): its registration state with Fabric Manager,
    and once that completed, its status (an nvmlReturn_t), clique and cluster."""

    state: int
    status: int | None = None  # nvml.h: "must be checked only if state returns complete"
    clique_id: int = 0
    cluster_uuid: str = ""


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of a GPU (a compute instance within a GPU instance)."""

    gpu_instance: int
    compute_instance: int
    uuid: str = ""
    name: str = ""


@dataclass(frozen=True)
class GpuSample:
    """One GPU's reading: value name -> raw value, and labelled values keyed by their extra labels."""

    identity: GpuIdentity
    scalars: Mapping[NvmlValue, float] = field(default_factory=dict)
    labelled: Mapping[NvmlValue, Mapping[tuple[str, ...], float]] = field(default_factory=dict)
    processes: tuple[GpuProcess, ...] = ()
    nvlink_links: int = 0
    fabric: FabricInfo | None = None
    mig: tuple[MigDevice, ...] = ()


@dataclass(frozen=True)
class NvmlReading:
    driver_version: str
    nvml_version: str
    device_count: int
    samples: tuple[GpuSample, ...]
    lost: tuple[GpuIdentity, ...]


@dataclass
class _Values:
    """Values being read, in the shape of :class:`GpuSample`."""

    scalars: dict[NvmlValue, float] = field(default_factory=dict)
    labelled: dict[NvmlValue, dict[tuple[str, ...], float]] = field(default_factory=dict)

    def put(self, key: NvmlValue, value: Any, labels: tuple[str, ...] = ()) -> None:
        if value is None:
            return
        if labels:
            self.labelled.setdefault(key, {})[labels] = float(value)
        else:
            self.scalars[key] = float(value)

    def add(self, key: NvmlValue, value: float, labels: tuple[str, ...]) -> None:
        """A value summed with what is there (counters read in parts)."""
        self.labelled.setdefault(key, {})[labels] = self.labelled.get(key, {}).get(labels, 0.0) + value

    def merge(self, other: _Values) -> None:
        self.scalars.update(other.scalars)
        for key, values in other.labelled.items():
            self.labelled.setdefault(key, {}).update(values)


@dataclass
class _Gpu:
    """What the source keeps of one GPU between collections."""

    handle: Any
    identity: GpuIdentity
    constants: _Values | None = None  # read once; None: read them (again) at the next collection
    slow: _Values = field(default_factory=_Values)  # the last slow read, served until the next
    slow_due: float = 0.0
    nvlink_links: int = 0
    gpm: bool = False
    gpm_pcie: bool = False  # GPM answers PCIe rates: no need for the byte counters
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, current], reused every collection
    gpm_primed: bool = False
    gpm_sampled_at: float = 0.0  # when the current sample was taken (the reader's clock)
    gpm_nvlink: bool = False  # GPM answers NVLink rates: no need for the byte counters
    nvlink_kib: dict[tuple[str, ...], float] = field(default_factory=dict)  # GPM's NVLink rates, summed over time
    fabric: FabricInfo | None = None  # the last slow read's
    mig: list[tuple[Any, MigDevice]] = field(default_factory=list)  # (handle, device), enumerated at slow reads
    mig_samples: dict[int, list[Any]] = field(default_factory=dict)  # GPU instance -> [previous, current]
    since_load: dict[tuple[str, ...], float] = field(default_factory=dict)  # counters only a reset lowers


class NvmlSource:
    """Owns the NVML session, the per-GPU state (handles, constants, schedules, GPM samples) and the event watcher."""

    def __init__(self, lost_retry: float = 60.0, on_xid: Callable[[XidSighting], object] | None = None,
                 clock: Callable[[], float] = time.monotonic, slow_interval: float = 60.0,
                 unsupported_retry: float = 600.0, per_link: bool = False, pcie_sampler: bool = False,
                 binding: Any = None, wall: Callable[[], float] = time.time) -> None:
        """``binding``: a loaded ``pynvml`` module to use instead of importing it (a simulator runs one NVML per
        simulated node in one process); ``wall``: the Unix clock that stamps Xid events."""
        self.lost_retry = lost_retry
        self.slow_interval = slow_interval
        self.unsupported_retry = unsupported_retry
        self.per_link = per_link  # NVLink errors per link and the PCIe link events (detail=all)
        self.pcie_sampler = pcie_sampler
        self._on_xid = on_xid
        self._clock = clock
        self.wall = wall
        self._binding = binding
        self._nvml: Any = None
        self._lock = threading.Lock()
        self._gpus: dict[int, _Gpu] = {}
        self._identities: dict[int, GpuIdentity] = {}  # kept after a GPU is lost, to name it
        self._lost_since: dict[int, float] = {}
        self._missing: set[str] = set()  # wrappers whose symbol the driver lacks
        self._quiet: set[tuple[int, str]] = set()  # (gpu, call) already logged as unsupported/failing
        self._skip_until: dict[tuple[int, str], float] = {}  # (gpu, call or field) -> when to ask again
        self._refresh: set[int] = set()  # GPUs whose slow values an NVML error event made stale
        self._versions = ("", "")
        self._watcher: EventWatcher | None = None
        self._now = 0.0

    # -- session -----------------------------------------------------------------------------------

    def _open(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        pynvml = self._binding
        if pynvml is None:
            try:
                pynvml = importlib.import_module("pynvml")  # lazy: nodes without the collector never load it
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
            self._end_session()
        finally:
            self._lock.release()

    def _end_session(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if self._nvml is not None:
            for index in list(self._gpus):
                self._forget(index)
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self._nvml = None

    def _forget(self, index: int) -> None:
        """Drop what is kept of one GPU: the next reading starts it afresh (handle, identity, constants)."""
        gpu = self._gpus.pop(index, None)
        if gpu is not None and self._nvml is not None:
            for sample in [*gpu.gpm_samples, *(s for pair in gpu.mig_samples.values() for s in pair)]:
                with contextlib.suppress(Exception):
                    self._nvml.nvmlGpmSampleFree(sample)

    # -- isolated calls ----------------------------------------------------------------------------

    def _attempt(self, gpu: int, key: str, call: Callable[..., Any], *args: Any) -> Any:
        """One NVML call: its value, or None when unsupported/missing/failing. GPU_IS_LOST raises GpuLost.

        A call answered NOT_SUPPORTED or NO_PERMISSION is not made again for ``unsupported_retry`` seconds.
        """
        nvml = self._nvml
        if key in self._missing or self._skipped(gpu, key):
            return None
        try:
            return call(*args)
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost(gpu) from None
        except nvml.NVMLError_FunctionNotFound:
            logger.debug("NVML: %s is not in this driver; falling back", key)
            self._missing.add(key)
        except nvml.NVMLError as exc:
            if type(exc).__name__ in _SESSION_GONE and gpu >= 0:
                raise _SessionGone(str(exc)) from None
            self._refused(gpu, key, exc)
        except Exception as exc:  # a binding/driver mismatch must cost one value, not the GPU
            if (gpu, key) not in self._quiet:
                self._quiet.add((gpu, key))
                logger.warning("NVML: gpu %s: %s: %s: %s", gpu, key, type(exc).__name__, exc)
        return None

    def _refused(self, gpu: int, key: str, exc: Exception) -> None:
        lasting = type(exc).__name__ in _LASTING
        if lasting:
            self._skip_until[(gpu, key)] = self._now + self.unsupported_retry
        if (gpu, key) not in self._quiet:
            self._quiet.add((gpu, key))
            level = logging.DEBUG if lasting else logging.WARNING
            logger.log(level, "NVML: gpu %s: %s: %s", gpu, key, exc)

    def _skipped(self, gpu: int, key: str) -> bool:
        until = self._skip_until.get((gpu, key))
        if until is None:
            return False
        if self._now < until:
            return True
        del self._skip_until[(gpu, key)]  # time to ask again
        return False

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
            try:
                return self._read()
            except _SessionGone as exc:
                logger.warning("NVML: %s: the driver was reloaded; opening the NVML session again", exc)
                self._end_session()
            try:
                return self._read()
            except _SessionGone as exc:
                self._end_session()
                raise NoHardware(f"NVML: {exc}") from None

    def _read(self) -> NvmlReading:
        nvml = self._open()
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            if type(exc).__name__ in _SESSION_GONE:
                raise _SessionGone(str(exc)) from None
            raise NoHardware(f"NVML cannot count GPUs: {exc}") from None
        samples: list[GpuSample] = []
        lost: list[GpuIdentity] = []
        self._now = now = self._clock()
        for index in range(count):
            since = self._lost_since.get(index)
            if since is not None and now - since < self.lost_retry:
                lost.append(self._identities.get(index, GpuIdentity(index)))
                continue
            try:
                samples.append(self._read_gpu(index, count))
                if since is not None:
                    logger.warning("NVML: gpu %d is back", index)
                self._lost_since.pop(index, None)
            except GpuLost:
                if since is None:
                    logger.error("NVML: gpu %d is lost (GPU_IS_LOST); retrying every %.0fs", index, self.lost_retry)
                self._lost_since[index] = now
                self._forget(index)  # back, it is read afresh: it may have been reset meanwhile
                lost.append(self._identities.get(index, GpuIdentity(index)))
        if self._on_xid is not None:
            # Started once handles and PCI addresses are known, so every event can be attributed;
            # a GPU back from being lost is watched again.
            if self._watcher is None:
                self._watcher = EventWatcher(self, self._on_xid)
            self._watcher.sync()
        return NvmlReading(self._versions[0], self._versions[1], count, tuple(samples), tuple(lost))

    def identity(self, index: int) -> GpuIdentity | None:
        return self._identities.get(index)

    def handles(self) -> dict[int, Any]:
        return {i: g.handle for i, g in self._gpus.items() if i not in self._lost_since}

    def refresh(self, index: int) -> None:
        """Read the GPU's slow values at its next collection (an NVML error event said they moved)."""
        self._refresh.add(index)

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

    def _state(self, index: int, count: int) -> _Gpu:
        gpu = self._gpus.get(index)
        if gpu is not None:
            return gpu
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError_GpuIsLost:
            raise GpuLost(index) from None
        except nvml.NVMLError as exc:
            if type(exc).__name__ in _SESSION_GONE:
                raise _SessionGone(str(exc)) from None
            raise
        identity = self._identify(index, handle)
        self._identities[index] = identity
        # The GPUs' slow reads are spread over the interval, so no collection reads them all.
        gpu = _Gpu(handle, identity, slow_due=self._now + self.slow_interval * (index + 1) / max(count, 1))
        self._gpus[index] = gpu
        return gpu

    def _read_gpu(self, index: int, count: int) -> GpuSample:
        gpu = self._state(index, count)
        fresh = gpu.constants is None
        if fresh:
            gpu.constants = self._read_constants(index, gpu)
        values = _Values()
        values.merge(gpu.constants)  # type: ignore[arg-type]  # set just above
        self._read_fast(index, gpu, values)
        slow = fresh or index in self._refresh or self._now >= gpu.slow_due
        wanted = [f for f in (*GPU_FIELDS, *LINK_FIELDS)
                  if (f.cost == "fast" or (slow and f.cost == "slow")) and self._wanted(gpu, f)]
        links = range(gpu.nvlink_links)
        fields = self._field_values(index, gpu.handle,
                                    [(f.id, scope) for f in wanted for scope in self._scopes(f, links)])
        for f in wanted:
            if f.cost == "fast" and f.value is not None and not f.per_link:
                values.put(f.value, fields.get((f.id, 0)), f.labels)
        if slow:
            self._refresh.discard(index)
            while gpu.slow_due <= self._now:  # the GPU keeps its place in the interval
                gpu.slow_due += self.slow_interval
            gpu.slow = self._read_slow(index, gpu, [f for f in wanted if f.cost == "slow"], fields)
            gpu.fabric = self._read_fabric(index, gpu.handle)
            if gpu.identity.mig_mode == "enabled":
                gpu.mig = self._read_mig_devices(index, gpu.handle)
            self._check_since_load(index, gpu)
        values.merge(gpu.slow)
        if gpu.fabric is not None:
            values.put("fabric_state", gpu.fabric.state)
            values.put("fabric_status", gpu.fabric.status)
        if gpu.mig:
            self._read_mig(index, gpu, values)
        processes = self._read_processes(index, gpu.handle, values)
        return GpuSample(gpu.identity, values.scalars, values.labelled, processes, gpu.nvlink_links, gpu.fabric,
                         tuple(device for _, device in gpu.mig))

    def _scopes(self, field: Field, links: range) -> Iterable[int]:
        """The scopes a field is asked with: each link (the driver's sum of them at the default level), or none."""
        if not field.per_link:
            return (0,)
        return (SCOPE_ALL_LINKS,) if field.all_links and not self.per_link and links else links

    def _wanted(self, gpu: _Gpu, field: Field) -> bool:
        """Whether this GPU is asked ``field``: at this detail level, and the PCIe bytes only without GPM rates."""
        if field.detail not in ("any", "all" if self.per_link else "default"):
            return False
        if field.id in NVLINK_BYTE_FIELDS and (gpu.gpm_nvlink or not gpu.nvlink_links):
            return False
        return not (field.id in PCIE_BYTE_FIELDS and gpu.gpm_pcie)

    def _read_constants(self, index: int, gpu: _Gpu) -> _Values:
        nvml, handle = self._nvml, gpu.handle
        out = _Values()

        def attempt(key: str, call: Callable[..., Any], *args: Any) -> Any:
            return self._attempt(index, key, call, handle, *args)

        out.put("slowdown_temperature", attempt("threshold_slowdown", nvml.nvmlDeviceGetTemperatureThreshold,
                                                nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
        out.put("shutdown_temperature", attempt("threshold_shutdown", nvml.nvmlDeviceGetTemperatureThreshold,
                                                nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN))
        for clock, clock_type in CLOCK_TYPES.items():
            out.put("clock_max", attempt(f"clock_max_{clock}", nvml.nvmlDeviceGetMaxClockInfo, clock_type), (clock,))
        out.put("pcie_max_generation", attempt("pcie_max_generation", nvml.nvmlDeviceGetMaxPcieLinkGeneration))
        out.put("pcie_max_width", attempt("pcie_max_width", nvml.nvmlDeviceGetMaxPcieLinkWidth))
        constant_fields = [(f.id, 0) for f in GPU_FIELDS if f.cost == "constant"]  # the NVLink link count
        links = self._field_values(index, handle, constant_fields).get((FI_DEV_NVLINK_LINK_COUNT, 0))
        gpu.nvlink_links = int(links or 0)
        support = attempt("gpm_support", nvml.nvmlGpmQueryDeviceSupport)
        gpu.gpm = bool(support is not None and support.isSupportedDevice)
        gpu.gpm_pcie = gpu.gpm  # until GPM says otherwise
        gpu.gpm_nvlink = gpu.gpm and gpu.nvlink_links > 0
        gpu.gpm_primed = False
        return out

    def _read_fast(self, index: int, gpu: _Gpu, out: _Values) -> None:
        nvml, handle = self._nvml, gpu.handle

        def attempt(key: str, call: Callable[..., Any], *args: Any) -> Any:
            return self._attempt(index, key, call, handle, *args)

        util = attempt("utilization", nvml.nvmlDeviceGetUtilizationRates)
        if util is not None:
            out.put("utilization", util.gpu)
            out.put("memory_utilization", util.memory)
        memory = self._first(
            index,
            ("memory_v2", lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)),
            ("memory_v1", lambda: nvml.nvmlDeviceGetMemoryInfo(handle)),
        )
        if memory is not None:
            out.put("memory_total", memory.total)
            out.put("memory_free", memory.free)
            out.put("memory_used", memory.used)
            out.put("memory_reserved", getattr(memory, "reserved", None))
        out.put("temperature", self._first(
            index,
            ("temperature_v", lambda: nvml.nvmlDeviceGetTemperatureV(handle, nvml.NVML_TEMPERATURE_GPU)),
            ("temperature", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        ))
        out.put("power", attempt("power", nvml.nvmlDeviceGetPowerUsage))
        for clock, clock_type in CLOCK_TYPES.items():
            out.put("clock", attempt(f"clock_{clock}", nvml.nvmlDeviceGetClockInfo, clock_type), (clock,))
        reasons = self._first(
            index,
            ("clocks_event_reasons", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
            ("clocks_throttle_reasons", lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
        )
        if reasons is not None:
            for reason, bit in THROTTLE_BITS.items():
                out.put("throttle_active", 1 if int(reasons) & bit else 0, (reason,))
        simple: tuple[tuple[NvmlValue, Callable[..., Any]], ...] = (
            ("pcie_generation", nvml.nvmlDeviceGetCurrPcieLinkGeneration),
            ("pcie_width", nvml.nvmlDeviceGetCurrPcieLinkWidth),
            ("performance_state", nvml.nvmlDeviceGetPerformanceState),
            ("fan_speed", nvml.nvmlDeviceGetFanSpeed),
        )
        for key, call in simple:
            out.put(key, attempt(key, call))
        if gpu.gpm:
            self._read_gpm(index, gpu, out)
        if self.pcie_sampler and not gpu.gpm_pcie:  # opt-in: 2 x 20 ms of sampling per GPU and collection
            for direction, counter in (("tx", nvml.NVML_PCIE_UTIL_TX_BYTES), ("rx", nvml.NVML_PCIE_UTIL_RX_BYTES)):
                out.put("pcie_throughput", attempt(f"pcie_{direction}", nvml.nvmlDeviceGetPcieThroughput, counter),
                        (direction,))

    def _read_slow(self, index: int, gpu: _Gpu, wanted: Iterable[Field],
                   fields: Mapping[tuple[int, int], float]) -> _Values:
        nvml, handle = self._nvml, gpu.handle
        out = _Values()
        totals = False
        for f in wanted:
            if f.value is None:
                continue
            if f.per_link and f.all_links and not self.per_link:  # the driver's sum over the links
                out.put(f.value, fields.get((f.id, SCOPE_ALL_LINKS)), ("", *f.labels))
            elif f.per_link:
                for link in range(gpu.nvlink_links):
                    value = fields.get((f.id, link))
                    if f.id == FI_DEV_NVLINK_GET_STATE:
                        if value is None:
                            value = self._attempt(index, f"nvlink_state {link}", nvml.nvmlDeviceGetNvLinkState,
                                                  handle, link)
                        value = None if value is None else (1 if value else 0)
                    out.put(f.value, value, (str(link), *f.labels))
            elif f.detail == "default":  # an all-link NVLink total: the default level drops the link label
                value = fields.get((f.id, 0))
                if value is not None:
                    out.add(f.value, value, ("", *f.labels))
                    totals = True
            else:
                out.put(f.value, fields.get((f.id, 0)), f.labels)
        out.put("power_limit", self._attempt(index, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle))
        self._fallbacks(index, handle, fields, out)
        if gpu.nvlink_links and not self.per_link and not totals:
            # No all-link totals from this driver: the per-link counters, summed at the default level.
            per_link = [f for f in LINK_FIELDS if f.value == "nvlink_errors"]
            links = range(gpu.nvlink_links)
            more = self._field_values(index, handle, [(f.id, link) for link in links for f in per_link])
            for f in per_link:
                for link in links:
                    out.put("nvlink_errors", more.get((f.id, link)), (str(link), *f.labels))
        return out

    def _fallbacks(self, index: int, handle: Any, fields: Mapping[tuple[int, int], float], out: _Values) -> None:
        """Older calls for values a driver without (those) field values still answers."""
        nvml = self._nvml
        if (FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0) not in fields:
            out.put("energy", self._attempt(index, "energy", nvml.nvmlDeviceGetTotalEnergyConsumption, handle))
        if (FI_DEV_ECC_SBE_VOL_TOTAL, 0) not in fields:
            for (error, counter), args in ECC_COUNTERS.items():
                out.put("ecc_errors", self._attempt(index, f"ecc_{error}_{counter}", nvml.nvmlDeviceGetTotalEccErrors,
                                                    handle, *args), (error, counter))
        if (FI_DEV_PCIE_REPLAY_COUNTER, 0) not in fields:
            out.put("pcie_replays", self._attempt(index, "pcie_replays", nvml.nvmlDeviceGetPcieReplayCounter, handle))
        if (FI_DEV_REMAPPED_COR, 0) not in fields:
            rows = self._attempt(index, "remapped_rows", nvml.nvmlDeviceGetRemappedRows, handle)
            if rows is not None:
                out.put("remapped_rows", rows[0], ("correctable",))
                out.put("remapped_rows", rows[1], ("uncorrectable",))
                out.put("row_remap_pending", rows[2])
                out.put("row_remap_failed", rows[3])

    def _check_since_load(self, index: int, gpu: _Gpu) -> None:
        """Counters only a GPU reset or a driver reload lowers: when one went down, read the constants again."""
        now: dict[tuple[str, ...], float] = {}
        if "energy" in gpu.slow.scalars:
            now[("energy",)] = gpu.slow.scalars["energy"]
        for labels, value in gpu.slow.labelled.get("ecc_errors", {}).items():
            if labels[1] == "volatile":
                now[("ecc", *labels)] = value
        if any(value < gpu.since_load.get(key, value) for key, value in now.items()):
            logger.warning("NVML: gpu %d: counters since driver load went down (the GPU was reset or the driver "
                           "reloaded); reading its constants again", index)
            gpu.constants = None
            gpu.identity = self._identities[index] = self._identify(index, gpu.handle)
        gpu.since_load = now

    def _read_processes(self, index: int, handle: Any, out: _Values) -> tuple[GpuProcess, ...]:
        nvml = self._nvml
        processes = self._first(
            index,
            ("processes_v3", lambda: nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)),
            ("processes_v2", lambda: nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)),
        )
        if processes is None:
            return ()
        procs = tuple(GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                                 _instance(getattr(p, "gpuInstanceId", NO_INSTANCE)))
                      for p in processes)
        out.put("processes", len(procs))
        out.put("process_memory", sum(p.used_bytes or 0 for p in procs))
        return procs

    def _field_values(self, index: int, handle: Any, ids: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
        """Batched field values: (field, scope) -> value for those the GPU answered ({} when the call is missing).

        A field answered NOT_SUPPORTED or NO_PERMISSION is left out of the batch for ``unsupported_retry``.
        """
        nvml = self._nvml
        asked = [(field_id, scope) for field_id, scope in ids if not self._skipped(index, f"field {field_id}.{scope}")]
        if not asked:
            return {}
        values = self._attempt(index, "field_values", nvml.nvmlDeviceGetFieldValues, handle, asked)
        if values is None:
            return {}
        out: dict[tuple[int, int], float] = {}
        for item in values:
            key = (int(item.fieldId), int(item.scopeId))
            if item.nvmlReturn != nvml.NVML_SUCCESS:
                self._refused(index, f"field {key[0]}.{key[1]}", nvml.NVMLError(item.nvmlReturn))
                continue
            out[key] = _field_value(item)
        return out

    def _read_gpm(self, index: int, gpu: _Gpu, out: _Values) -> None:
        """GPM ratios, PCIe and NVLink rates between this collection's sample and the previous one (two buffers,
        reused). NVLink rates are summed over the interval into byte counters (KiB, as the field values count)."""
        nvml = self._nvml
        if not self._gpm_sample(index, gpu.gpm_samples,
                                lambda sample: nvml.nvmlGpmSampleGet(gpu.handle, sample), "gpm_sample"):
            gpu.gpm_primed = False
            return
        previous, current = gpu.gpm_samples[1], gpu.gpm_samples[0]  # swapped: [0] is the sample just taken
        elapsed = self._now - gpu.gpm_sampled_at
        gpu.gpm_sampled_at = self._now
        if not gpu.gpm_primed:
            gpu.gpm_primed = True
            return  # the first sample: ratios need two
        wanted: dict[int, tuple[NvmlValue, tuple[str, ...]]] = {
            **{metric: (key, ()) for metric, key in GPM_METRICS.items()},
            **({metric: ("pcie_throughput", (direction,)) for metric, direction in GPM_PCIE.items()}
               if gpu.gpm_pcie else {}),
        }
        nvlink: dict[int, tuple[str, ...]] = {}
        if gpu.gpm_nvlink:
            if self.per_link:
                for link in range(min(gpu.nvlink_links, GPM_NVLINK_MAX_LINKS)):
                    nvlink.update({m: (str(link), d) for m, d in gpm_nvlink_link_metrics(link).items()})
            else:
                nvlink = {metric: ("", direction) for metric, direction in GPM_NVLINK_TOTAL.items()}
        answers = self._gpm_metrics(index, previous, current, [*wanted, *nvlink])
        if answers is None:
            return
        for metric_id, (key, labels) in wanted.items():
            value = answers.get(metric_id)
            if value is None:
                if metric_id in GPM_PCIE:
                    gpu.gpm_pcie = False  # read the byte counters instead, from the next slow read on
                continue
            # GPM's PCIe rates are MiB/s; the reading keeps NVML's PCIe throughput unit, KB/s.
            out.put(key, value * 1024 if metric_id in GPM_PCIE else value, labels)
        if nvlink and any(answers.get(metric_id) is None for metric_id in nvlink):
            gpu.gpm_nvlink = False  # the NVLink byte counters instead, from the next slow read on
            gpu.nvlink_kib.clear()
            return
        for metric_id, labels in nvlink.items():  # MiB/s over the interval -> KiB moved
            gpu.nvlink_kib[labels] = gpu.nvlink_kib.get(labels, 0.0) + answers[metric_id] * 1024 * elapsed
        for labels, kib in gpu.nvlink_kib.items():
            out.put("nvlink_bytes", kib, labels)

    def _gpm_sample(self, index: int, pair: list[Any], take: Callable[[Any], Any], key: str) -> bool:
        """Take a GPM sample into the older of ``pair``'s two buffers (allocated once) and put it first."""
        nvml = self._nvml
        while len(pair) < 2:  # kept for the GPU's life: one allocation, not one per collection
            sample = self._attempt(index, "gpm_alloc", nvml.nvmlGpmSampleAlloc)
            if sample is None:
                return False
            pair.append(sample)
        pair.reverse()  # [older, newer] -> the older buffer takes this sample
        return self._attempt(index, key, take, pair[0]) is not None

    def _gpm_metrics(self, index: int, previous: Any, current: Any, metric_ids: list[int]) -> dict[int, float] | None:
        """metric id -> value of those GPM answered between two samples (None: the call failed)."""
        nvml = self._nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1, request.sample2 = previous, current
        for slot, metric_id in enumerate(metric_ids):
            request.metrics[slot].metricId = metric_id
        result = self._attempt(index, "gpm_metrics", nvml.nvmlGpmMetricsGet, request)
        if result is None:
            return None
        # A metric answered NaN is left out: an idle H200 answered DRAM_BW_UTIL so (benchmarks/real_h200_nvml.json)
        return {metric_id: float(result.metrics[slot].value) for slot, metric_id in enumerate(metric_ids)
                if result.metrics[slot].nvmlReturn == nvml.NVML_SUCCESS and math.isfinite(result.metrics[slot].value)}

    # -- fabric and MIG ----------------------------------------------------------------------------

    def _read_fabric(self, index: int, handle: Any) -> FabricInfo | None:
        """The GPU's NVLink fabric registration (Hopper+ with NVSwitch); None where the call is not supported
        (PCIe cards, older GPUs and drivers). A GPU that answers state NOT_SUPPORTED says so: kept as state 0."""
        nvml = self._nvml

        def versioned() -> Any:
            info = nvml.c_nvmlGpuFabricInfo_v2_t()  # sets its version, nvmlGpuFabricInfo_v2
            nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
            return info

        def first() -> Any:  # drivers before nvmlDeviceGetGpuFabricInfoV (R535): deprecated, same fields
            info = nvml.c_nvmlGpuFabricInfo_t()
            nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
            return info

        info = self._first(index, ("fabric_info_v", versioned), ("fabric_info", first))
        if info is None:
            return None
        state = int(info.state)
        if state != FABRIC_STATE_COMPLETED:
            return FabricInfo(state if state in range(FABRIC_STATE_NOT_SUPPORTED, FABRIC_STATE_COMPLETED) else -1)
        raw = bytes(info.clusterUuid)
        cluster = "" if not any(raw) else "-".join((raw[:4].hex(), raw[4:6].hex(), raw[6:8].hex(), raw[8:10].hex(),
                                                    raw[10:].hex()))
        return FabricInfo(state, int(info.status), int(info.cliqueId), cluster)

    def _read_mig_devices(self, index: int, handle: Any) -> list[tuple[Any, MigDevice]]:
        """The GPU's MIG devices: each slot up to nvmlDeviceGetMaxMigDeviceCount; an empty slot answers NOT_FOUND."""
        nvml = self._nvml
        count = self._attempt(index, "mig_count", nvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        out: list[tuple[Any, MigDevice]] = []
        for slot in range(int(count or 0)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError_GpuIsLost:
                raise GpuLost(index) from None
            except nvml.NVMLError as exc:
                if type(exc).__name__ not in ("NVMLError_NotFound", "NVMLError_InvalidArgument"):
                    self._refused(index, "mig_handle", exc)
                continue
            gi = self._attempt(index, "mig_gpu_instance", nvml.nvmlDeviceGetGpuInstanceId, mig)
            ci = self._attempt(index, "mig_compute_instance", nvml.nvmlDeviceGetComputeInstanceId, mig)
            if gi is None:
                continue
            out.append((mig, MigDevice(int(gi), int(ci or 0),
                                       str(self._attempt(index, "mig_uuid", nvml.nvmlDeviceGetUUID, mig) or ""),
                                       str(self._attempt(index, "mig_name", nvml.nvmlDeviceGetName, mig) or ""))))
        return out

    def _read_mig(self, index: int, gpu: _Gpu, out: _Values) -> None:
        """Per GPU instance: its memory (the instance's own, which its compute instances share) and GPM's ratios
        of its own sample (nvmlGpmMigSampleGet), every collection."""
        nvml = self._nvml
        seen: set[int] = set()
        for mig, device in gpu.mig:
            gi = device.gpu_instance
            if gi in seen:
                continue
            seen.add(gi)
            labels = (str(gi),)
            memory = self._attempt(index, "mig_memory", nvml.nvmlDeviceGetMemoryInfo, mig)
            if memory is not None:
                out.put("mig_memory_used", memory.used, labels)
                out.put("mig_memory_total", memory.total, labels)
            if not gpu.gpm:
                continue
            pair = gpu.mig_samples.setdefault(gi, [])
            primed = len(pair) == 2
            take = functools.partial(nvml.nvmlGpmMigSampleGet, gpu.handle, gi)
            if not self._gpm_sample(index, pair, take, "gpm_mig_sample"):
                for sample in gpu.mig_samples.pop(gi, []):  # primed again from two fresh samples
                    with contextlib.suppress(Exception):
                        nvml.nvmlGpmSampleFree(sample)
                continue
            if not primed:
                continue
            answers = self._gpm_metrics(index, pair[1], pair[0], list(GPM_METRICS)) or {}
            for metric_id, key in GPM_METRICS.items():
                out.put(MIG_GPM[key], answers.get(metric_id), labels)


def _instance(value: Any) -> int | None:
    """A process's or an event's MIG GPU instance id, None for the whole GPU (NO_INSTANCE, or not given)."""
    return None if value is None or int(value) == NO_INSTANCE else int(value)


def _field_value(item: Any) -> float:
    kind = int(item.valueType)
    union = item.value
    return float({0: union.dVal, 1: union.uiVal, 2: union.ulVal, 3: union.ullVal, 4: union.sllVal,
                  5: union.siVal, 6: union.usVal}.get(kind, union.ullVal))
class EventWatcher:
    """NVML error events, one event set and one thread per GPU: Xids go to ``on_xid``; any other error event
    (ECC, page retirement, recovery action) has the source read the GPU's slow values at its next collection.

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
                if data.eventType & ~EVENT_XID:  # ECC, retirement, recovery action: its slow values moved
                    self._source.refresh(index)
            return True
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)

    def _deliver(self, index: int, data: Any) -> None:
        identity = self._source.identity(index)
        if identity is None or identity.pci is None:
            return
        self._on_xid(XidSighting(identity.pci, int(data.eventData), self._source.wall(), "nvml"))
