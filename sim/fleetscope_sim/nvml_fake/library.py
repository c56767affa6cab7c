"""A fake ``libnvidia-ml.so.1`` for the real ``nvidia-ml-py`` code.

``pynvml`` loads the native library into its module global ``nvmlLib`` and
resolves every C symbol with ``getattr(nvmlLib, name)``. :class:`FakeNvml` is
an object that stands in for that ``CDLL``: each NVML entry point is an
attribute that takes the very ctypes arguments ``pynvml`` passes (``byref``
pointers, the binding's own ``Structure`` classes, string buffers), writes the
results into them and returns a real ``nvmlReturn_t`` code. A symbol the
simulated driver lacks raises ``AttributeError``, which ``pynvml`` turns into
``NVMLError_FunctionNotFound`` exactly as with an older ``libnvidia-ml``.

Units follow ``nvml.h``: MHz, milliwatts, millijoules, nanoseconds, percent,
KB/s for PCIe throughput. The state of each GPU is a :class:`FakeGpu` that
tests and the simulator change at runtime (``fake.gpu(3).set(temperature=91)``).
A value set to ``None`` makes the matching call or field answer
``NVML_ERROR_NOT_SUPPORTED``; a :class:`NvmlReturn` (``NvmlReturn.named("NVML_ERROR_NO_PERMISSION")``)
makes it answer that return code, and ``FakeGpu.errors`` gives one entry point or field of a GPU a
code of its own whatever the value (a field refused while the older call still answers).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from fleetscope.sources.nvml_h import (
    ARCHITECTURE_NUMBERS,
    CLOCK_TYPES,
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_GPU_IS_LOST,
    ERROR_INSUFFICIENT_SIZE,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    ERROR_UNINITIALIZED,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_DRAM_RETIREMENT,
    EVENT_DRAM_RETIREMENT_FAILURE,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    FABRIC_INFO_V2,
    FABRIC_INFO_V3,
    FABRIC_STATE_COMPLETED,
    FI_DEV_NVLINK_GET_STATE,
    FI_DEV_NVLINK_LINK_COUNT,
    FIELDS,
    FIELDS_BY_ID,
    GPM_METRICS,
    GPM_NVLINK_MAX_LINKS,
    GPM_NVLINK_TOTAL,
    GPM_PCIE,
    NO_INSTANCE,
    RETURN_CODES,
    SCOPE_ALL_LINKS,
    SUCCESS,
    THROTTLE_BITS,
    NvmlReturn,
    gpm_nvlink_link_metrics,
)
from fleetscope_sim.nvml_fake.latency import Booked, LatencyModel

NOT_SUPPORTED = NvmlReturn(ERROR_NOT_SUPPORTED)
Answer = int | NvmlReturn | None  # a value, a return code, or None for NOT_SUPPORTED
CLOCK_NAMES = {number: name for name, number in CLOCK_TYPES.items()}
# The reasons whose throttle duration is a field (the keys of FakeGpu.throttle_ns).
THROTTLED_REASONS = tuple(key for field in FIELDS if field.home[0] == "throttle_ns" for key in field.home[1:] if key)

# NVML_GPM_METRIC_PCIE_{TX,RX}_PER_SEC (MiB/s) -> the key GPM's answers are kept under
GPM_PCIE_KEYS = {metric: f"pcie_{direction}" for metric, direction in GPM_PCIE.items()}
# NVML_GPM_METRIC_NVLINK_{TOTAL,L<n>}_{RX,TX}_PER_SEC -> (link or None for all links, direction)
GPM_NVLINK_KEYS: dict[int, tuple[int | None, str]] = {
    **{metric: (None, direction) for metric, direction in GPM_NVLINK_TOTAL.items()},
    **{metric: (link, direction) for link in range(GPM_NVLINK_MAX_LINKS)
       for metric, direction in gpm_nvlink_link_metrics(link).items()},
}

HANDLE_BASE = 0x7F0000001000
MIG_HANDLE_BASE = 0x7F0000400000  # + gpu * 0x1000 + slot * 0x10: a MIG device's handle
SET_BASE = 0x7F0000800000
SAMPLE_BASE = 0x7F0000C00000
VALUE_TYPE_DOUBLE, VALUE_TYPE_UINT, VALUE_TYPE_ULL, VALUE_TYPE_SLL = 0, 1, 3, 4


def _zeros(*keys: str) -> dict[str, Answer]:
    return dict.fromkeys(keys, 0)


def _idle_gpm() -> dict[str, float | NvmlReturn]:
    return dict.fromkeys(GPM_METRICS.values(), 0.0)


@dataclass
class FakeGpu:
    """The simulated state of one GPU, in NVML's own units."""

    index: int = 0
    name: str | NvmlReturn = "NVIDIA H100 80GB HBM3"
    uuid: str | NvmlReturn = ""
    serial: str | NvmlReturn = ""
    pci_domain: int = 0
    pci_bus: int = 0
    pci_device: int = 0
    pci_device_id: int = 0x233010DE
    vbios_version: str | NvmlReturn = "96.00.99.00.01"
    architecture: str | NvmlReturn = "hopper"
    mig_mode: Answer = 0
    utilization_gpu: Answer = 0
    utilization_memory: int | None = 0
    memory_total: int = 81559 * 1024 * 1024
    memory_used: int = 0
    memory_reserved: Answer = 535 * 1024 * 1024
    temperature: Answer = 35
    memory_temperature: Answer = 40
    slowdown_temperature: Answer = 90
    shutdown_temperature: Answer = 92
    power_mw: Answer = 70000
    power_limit_mw: Answer = 700000
    energy_mj: Answer = 0
    clocks_mhz: dict[str, Answer] = field(default_factory=lambda: {"sm": 1980, "memory": 2619, "graphics": 1980})
    max_clocks_mhz: dict[str, Answer] = field(default_factory=lambda: {"sm": 1980, "memory": 2619, "graphics": 1980})
    throttle_reasons: Answer = 0
    throttle_ns: dict[str, Answer] = field(default_factory=lambda: _zeros(*THROTTLED_REASONS))
    ecc: dict[str, Answer] | NvmlReturn | None = field(default_factory=lambda: _zeros(
        "corrected_volatile", "uncorrected_volatile", "corrected_aggregate", "uncorrected_aggregate"))
    retired_pages_sbe: Answer = 0
    retired_pages_dbe: Answer = 0
    retired_pages_pending: Answer = 0
    remapped_rows: dict[str, Answer] | NvmlReturn | None = field(default_factory=lambda: _zeros(
        "correctable", "uncorrectable", "pending", "failure"))
    pcie_replays: Answer = 0
    pcie_generation: Answer = 5
    pcie_max_generation: Answer = 5
    pcie_width: Answer = 16
    pcie_max_width: Answer = 16
    pcie_tx_kbps: Answer = 0  # nvmlDeviceGetPcieThroughput's 20 ms sample; GPM's PCIe rates, unless gpm says
    pcie_rx_kbps: Answer = 0
    # Counters since driver load (NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES); None (NOT_SUPPORTED) unless a scenario
    # says: a capture taken before fleetscope read them must not replay zeros.
    pcie_tx_bytes: Answer = None
    pcie_rx_bytes: Answer = None
    # PCIe error and link-event counters (NVML_FI_DEV_PCIE_COUNT_*, the field table's keys); likewise.
    pcie_errors: dict[str, Answer] | None = None
    nvlink_up: list[bool | NvmlReturn | None] = field(default_factory=lambda: [True] * 18)
    nvlink_errors: dict[str, list[Answer]] = field(default_factory=dict)  # "replay"/"recovery"/"crc" -> per link
    # The all-link totals ("replay", "recovery", "crc_flit", "crc_data") where a capture recorded them; a total
    # not given is the sum of its links (data CRC: 0, the fake counts CRC errors once).
    nvlink_error_totals: dict[str, Answer] = field(default_factory=dict)
    performance_state: Answer = 0
    fan_percent: Answer = None  # passively cooled SXM boards have no fan
    recovery_action: Answer = 0
    # (pid, used bytes or None: NVML_VALUE_NOT_AVAILABLE), or the call's return code
    processes: list[Sequence[int | None]] | NvmlReturn = field(default_factory=list)
    gpm: dict[str, float | NvmlReturn] | NvmlReturn | None = field(default_factory=_idle_gpm)
    # nvmlDeviceGetGpuFabricInfoV: {"state": 0-3, "status": 0 or a return code, "clique_id", "cluster_uuid",
    # "health_mask"} (keys not given: 0, ""); None: the call answers NOT_SUPPORTED (PCIe boards, pre-Hopper)
    fabric: dict[str, Any] | NvmlReturn | None = None
    # NVLink data moved per link: KiB counters since driver load (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}, by
    # "tx"/"rx"), and the rates GPM reports per link (MiB/s, NVML_GPM_METRIC_NVLINK_*_PER_SEC). Not given:
    # NOT_SUPPORTED, so a capture taken before fleetscope read them replays no zeros.
    nvlink_kib: dict[str, Any] = field(default_factory=dict)  # direction -> per-link list (one number: every link)
    nvlink_mibps: dict[str, Any] = field(default_factory=dict)
    # nvmlDeviceGetMaxMigDeviceCount (None: a GPU without MIG), and the MIG devices while mig_mode is 1, each
    # {"gpu_instance", "compute_instance", "slot", "name", "uuid", "memory_total", "memory_used", "gpm": {...},
    # "processes": [[pid, used]]}
    max_mig_devices: Answer = 7
    mig_devices: list[dict[str, Any]] = field(default_factory=list)
    supported_events: Answer = (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID | EVENT_DRAM_RETIREMENT
                                 | EVENT_DRAM_RETIREMENT_FAILURE)
    # Entry points (C symbol) and fields ("field:<id>") of this GPU that answer a code of their own.
    errors: dict[str, NvmlReturn] = field(default_factory=dict)
    lost: bool = False

    def __post_init__(self) -> None:
        if not self.serial:
            self.serial = f"{1654922000000 + self.index}"
        if not self.uuid:
            digest = hashlib.sha256(f"{self.serial}:{self.pci_bus}".encode()).hexdigest()
            self.uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        for kind in ("replay", "recovery", "crc"):
            self.nvlink_errors.setdefault(kind, [0] * len(self.nvlink_up))
        for per_link in (self.nvlink_kib, self.nvlink_mibps):  # one number: the same on every link
            for direction in ("tx", "rx"):
                value = per_link.setdefault(direction, [None] * len(self.nvlink_up))
                if not isinstance(value, list):
                    per_link[direction] = [value] * len(self.nvlink_up)
        self.mig_devices = [dict(device) for device in self.mig_devices]  # a GPU's own (scenarios share them)
        for slot, device in enumerate(self.mig_devices):
            device.setdefault("slot", slot)
            device.setdefault("compute_instance", 0)
            if not device.get("uuid"):
                seed = f"{self.uuid}:{device['gpu_instance']}:{device['compute_instance']}"
                text = hashlib.sha256(seed.encode()).hexdigest()
                device["uuid"] = f"MIG-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"

    def mig_slot(self, slot: int) -> dict[str, Any] | None:
        """The MIG device in that slot (nvmlDeviceGetMigDeviceHandleByIndex), while MIG is enabled."""
        if self.mig_mode != 1:
            return None
        return next((device for device in self.mig_devices if device["slot"] == slot), None)

    @property
    def bus_id(self) -> str:
        """NVML's ``busId`` form: 8-hex domain, upper case, function 0."""
        return f"{self.pci_domain:08X}:{self.pci_bus:02X}:{self.pci_device:02X}.0"

    @property
    def sysfs_address(self) -> str:
        return f"{self.pci_domain:04x}:{self.pci_bus:02x}:{self.pci_device:02x}.0"

    def set(self, **changes: Any) -> FakeGpu:
        """Change state at runtime; unknown names raise so a typo never silently does nothing."""
        names = {f.name for f in dataclasses.fields(self)}
        for key, value in changes.items():
            if key not in names:
                raise AttributeError(f"FakeGpu has no field {key!r}")
            current = getattr(self, key)
            if isinstance(current, dict) and isinstance(value, dict):
                current.update(value)
            else:
                setattr(self, key, value)
        return self

    def nvlink_total(self, kind: str) -> Any:
        """An all-link NVLink error total: recorded, else the sum of the links that answer (none: no links)."""
        if kind in self.nvlink_error_totals:
            return self.nvlink_error_totals[kind]
        if not self.nvlink_up:
            return None
        if kind == "crc_data":
            return 0
        counts = [v for v in self.nvlink_errors.get(kind.removesuffix("_flit"), []) if isinstance(v, int)]
        return sum(counts) if counts else None

    def gpm_metrics(self) -> dict[str, Any]:
        """What GPM answers between two samples: ``gpm``, with the PCIe rates (MiB/s) it does not name taken
        from the traffic the 20 ms sampler sees."""
        gpm: dict[str, Any] = dict(self.gpm) if isinstance(self.gpm, dict) else {}
        for key, kbps in (("pcie_tx", self.pcie_tx_kbps), ("pcie_rx", self.pcie_rx_kbps)):
            if key not in gpm and gpm:
                gpm[key] = kbps / 1024 if isinstance(kbps, int) else kbps
        if gpm and self.nvlink_up:  # NVLink rates per link and in all, as GPM reports them (MiB/s)
            for direction, rates in self.nvlink_mibps.items():
                for link, rate in enumerate(rates):
                    gpm[f"nvlink_{direction}_{link}"] = rate
                numbers = [r for r in rates if isinstance(r, (int, float))]
                gpm.setdefault(f"nvlink_{direction}", sum(numbers) if len(numbers) == len(rates) else None)
        return gpm

    def throttle(self, *reasons: str) -> None:
        """Set the active clocks-event reasons by name (none: clocks unrestricted)."""
        self.throttle_reasons = 0
        for reason in reasons:
            self.throttle_reasons |= THROTTLE_BITS[reason]


# Getters that write one integer read straight off the GPU model: one row each, not one method each.
SCALAR_GETTERS: dict[str, Callable[[FakeGpu], Any]] = {
    "nvmlDeviceGetIndex": attrgetter("index"),
    "nvmlDeviceGetArchitecture": lambda gpu: (
        gpu.architecture if isinstance(gpu.architecture, NvmlReturn) else ARCHITECTURE_NUMBERS.get(gpu.architecture)),
    "nvmlDeviceGetPowerUsage": attrgetter("power_mw"),
    "nvmlDeviceGetEnforcedPowerLimit": attrgetter("power_limit_mw"),
    "nvmlDeviceGetTotalEnergyConsumption": attrgetter("energy_mj"),
    "nvmlDeviceGetCurrentClocksEventReasons": attrgetter("throttle_reasons"),
    "nvmlDeviceGetCurrentClocksThrottleReasons": attrgetter("throttle_reasons"),
    "nvmlDeviceGetPcieReplayCounter": attrgetter("pcie_replays"),
    "nvmlDeviceGetCurrPcieLinkGeneration": attrgetter("pcie_generation"),
    "nvmlDeviceGetMaxPcieLinkGeneration": attrgetter("pcie_max_generation"),
    "nvmlDeviceGetCurrPcieLinkWidth": attrgetter("pcie_width"),
    "nvmlDeviceGetMaxPcieLinkWidth": attrgetter("pcie_max_width"),
    "nvmlDeviceGetPerformanceState": attrgetter("performance_state"),
    "nvmlDeviceGetFanSpeed": attrgetter("fan_percent"),
    "nvmlDeviceGetSupportedEventTypes": attrgetter("supported_events"),
}


class CFunction:
    """One exported symbol: callable like a ctypes function pointer, with a settable ``restype``."""

    def __init__(self, name: str, impl: Callable[..., Any], fake: FakeNvml) -> None:
        self.__name__ = name
        self._impl = impl
        self._fake = fake
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        fake = self._fake
        fake._maybe_hang(self.__name__)
        with fake._calls_lock:
            fake.calls[self.__name__] = fake.calls.get(self.__name__, 0) + 1
        if fake.latency is None:
            return self._impl(*args)
        started = time.thread_time()
        result: Any = None
        try:
            result = self._impl(*args)
            return result
        finally:
            fake._book(self.__name__, args, result, time.thread_time() - started)


def _value(arg: Any) -> int:
    """A ctypes scalar or a plain Python int, as int."""
    return int(getattr(arg, "value", arg))


def _out(ref: Any) -> Any:
    """The object behind a ``byref()`` argument (or the object itself)."""
    return getattr(ref, "_obj", ref)


VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # nvml.h NVML_VALUE_NOT_AVAILABLE (unsigned long long)


class Refused(Exception):
    """A field (or call) answers this return code instead of a value."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _entry(container: Any, key: str) -> Any:
    """One value of a per-key state (ECC, clocks, ...) that may itself be None or a :class:`NvmlReturn`."""
    if container is None or isinstance(container, NvmlReturn):
        return container
    return container.get(key)


def _number(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _link_state(up: bool | NvmlReturn | None) -> Any:
    return up if up is None or isinstance(up, NvmlReturn) else (1 if up else 0)


def _first_key(arg: Any) -> int:
    """Whom a device call's first call is about: its handle, or the index it asks a handle for."""
    try:
        return _address(arg)
    except (ctypes.ArgumentError, TypeError):
        return _value(_out(arg)) if not hasattr(arg, "_obj") else 0


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def _write_pointer(ref: Any, address: int) -> None:
    ctypes.c_void_p.from_buffer(_out(ref)).value = address


def _write_string(buffer: Any, length: Any, text: str) -> int:
    data = text.encode()
    if len(data) + 1 > _value(length):
        return ERROR_INSUFFICIENT_SIZE
    buffer.value = data
    return SUCCESS


class FakeNvml:
    """The fake native library. Build one with :func:`~fleetscope_sim.nvml_fake.scenarios.load_scenario` or
    directly from ``FakeGpu`` objects."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        driver_version: str = "550.90.07",
        nvml_version: str = "12.550.90.07",
        cuda_driver_version: int = 12040,
        missing_functions: tuple[str, ...] = (),
        max_field_id: int = 400,
        name: str = "custom",
        init_error: NvmlReturn | None = None,
        latency: LatencyModel | None = None,
    ) -> None:
        self.name = name
        self.latency = latency  # None: every call is free
        self.init_error = init_error  # nvmlInit answers this (a node whose driver is not loaded)
        self.gpus = gpus
        self.driver_version = driver_version
        self.nvml_version = nvml_version
        self.cuda_driver_version = cuda_driver_version
        self.missing_functions = set(missing_functions)
        self.max_field_id = max_field_id  # fields newer than the simulated driver answer NOT_SUPPORTED
        self.initialized = 0
        self.calls: dict[str, int] = {}
        self.fields_asked: Counter[int] = Counter()  # field id -> times asked in nvmlDeviceGetFieldValues
        self._calls_lock = threading.Lock()
        self._booked: dict[int, Booked] = {}  # thread -> what its calls cost on the latency model
        self._called: set[tuple[str, int]] = set()  # (symbol, handle) called before: not a first call any more
        self._hang: dict[str, threading.Event] = {}
        lock = threading.RLock()
        self._events = threading.Condition(lock)
        self._quiet = threading.Condition(lock)  # settle() waits here: a watcher back in its wait notifies it
        self._sets: dict[int, dict[str, Any]] = {}
        self._waiting: Counter[int] = Counter()  # event set -> threads inside nvmlEventSetWait on it now
        self._samples: dict[int, dict[str, Any] | None] = {}
        self._next_sample = 0
        self._next_set = 0
        self.pending_events: list[tuple[int, int, int]] = []  # delivered when the GPU is registered
        self._functions = {
            attr[1:]: CFunction(attr[1:], getattr(self, attr), self) for attr in dir(self) if attr.startswith("_nvml")
        }
        for getter, read in SCALAR_GETTERS.items():
            self._functions[getter] = CFunction(getter, functools.partial(self._scalar_getter, getter, read), self)

    # -- scenario API ----------------------------------------------------------------------------

    def gpu(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def lose(self, index: int) -> None:
        """The GPU falls off the bus: every call on it answers GPU_IS_LOST, event waits too."""
        self.gpus[index].lost = True
        with self._events:
            self._events.notify_all()

    def recover(self, index: int) -> None:
        self.gpus[index].lost = False

    def inject_xid(self, index: int, xid: int) -> None:
        """Deliver an Xid critical-error event to every event set registered for this GPU."""
        self.inject_event(index, EVENT_XID, xid)

    def inject_event(self, index: int, event_type: int, data: int = 0) -> None:
        with self._events:
            for event_set in self._sets.values():
                if event_set["registered"].get(index, 0) & event_type:
                    event_set["queue"].append((index, event_type, data))
            self._events.notify_all()

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until every event delivered so far has been taken and handled: each event set is empty and its
        watcher is back waiting on it (the watcher handles an event before it waits again). False on ``timeout``.

        What a virtual-time run calls between a GPU's change and the collection that must see it, so whether
        the collection sees an event does not depend on how fast a thread was scheduled."""
        deadline = time.monotonic() + timeout
        with self._events:
            while any(target["queue"] or not self._waiting[address] for address, target in self._sets.items()
                      if target["registered"]):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._quiet.wait(min(remaining, 0.05))  # a set freed or emptied notifies nobody: look again soon
        return True

    def hang(self, function: str) -> threading.Event:
        """Make calls to ``function`` block until the returned event is set (or :meth:`release`)."""
        gate = threading.Event()
        self._hang[function] = gate
        return gate

    def release(self) -> None:
        for gate in self._hang.values():
            gate.set()
        self._hang.clear()

    def _maybe_hang(self, name: str) -> None:
        gate = self._hang.get(name)
        if gate is not None:
            gate.wait()

    def reset_gpu(self, index: int, **changes: Any) -> FakeGpu:
        """A GPU reset (``nvidia-smi -r``): the counters kept since the driver loaded or the GPU was last reset
        start again from 0 (volatile ECC, energy, throttle time); ``changes`` are what the reset brought (a
        new power limit, an updated VBIOS's clocks)."""
        gpu = self.gpus[index]
        if isinstance(gpu.ecc, dict):
            gpu.ecc.update(corrected_volatile=0, uncorrected_volatile=0)
        gpu.energy_mj = 0 if isinstance(gpu.energy_mj, int) else gpu.energy_mj
        gpu.throttle_ns = {k: (0 if isinstance(v, int) else v) for k, v in gpu.throttle_ns.items()}
        return gpu.set(**changes)

    def reload_driver(self) -> None:
        """The kernel driver reloaded under a running client: every call answers UNINITIALIZED until NVML is
        initialized again, and every GPU was reset."""
        self.initialized = 0
        for index in range(len(self.gpus)):
            self.reset_gpu(index)

    def booked(self, thread: int | None = None) -> Booked:
        """What the calls of ``thread`` (default: the calling thread) cost on the latency model so far."""
        return self._booked.setdefault(threading.get_ident() if thread is None else thread, Booked())

    def _book(self, name: str, args: tuple[Any, ...], result: Any, own_seconds: float) -> None:
        assert self.latency is not None
        device = _first_key(args[0]) if args and name.startswith("nvmlDevice") else 0
        fields: list[tuple[int, bool]] = []
        if name == "nvmlDeviceGetFieldValues" and result == SUCCESS:  # each field as answered or refused
            values = _out(args[2])
            fields = [(int(values[i].fieldId), values[i].nvmlReturn == SUCCESS) for i in range(_value(args[1]))]
        with self._calls_lock:
            first = (name, device) not in self._called
            self._called.add((name, device))
        booked = self.booked()
        booked.modelled_seconds += self.latency.cost_us(name, first, fields) / 1e6
        booked.own_seconds += own_seconds
        booked.calls += 1

    def __getattr__(self, name: str) -> CFunction:
        # Only reached for names that are not regular attributes: the C symbols.
        functions = self.__dict__.get("_functions", {})
        if name in self.__dict__.get("missing_functions", ()) or name not in functions:
            raise AttributeError(name)
        function: CFunction = functions[name]
        return function

    # -- helpers ---------------------------------------------------------------------------------

    def _device(self, handle: Any) -> FakeGpu | None:
        index = (_address(handle) - HANDLE_BASE) // 0x100
        if 0 <= index < len(self.gpus) and _address(handle) == HANDLE_BASE + index * 0x100:
            return self.gpus[index]
        return None

    def _query(self, handle: Any, function: str, value: Any, writer: Callable[[Any], None]) -> int:
        """The common shape of a device query: checks, then write one value."""
        if not self.initialized:
            return ERROR_UNINITIALIZED
        gpu = self._device(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        if gpu.lost:
            return ERROR_GPU_IS_LOST
        if function in gpu.errors:
            return gpu.errors[function].code
        if value is None:
            return ERROR_NOT_SUPPORTED
        if isinstance(value, NvmlReturn):
            return value.code
        writer(value)
        return SUCCESS

    def _scalar_getter(self, function: str, read: Callable[[FakeGpu], Any], handle: Any, ref: Any) -> int:
        gpu = self._device(handle)
        return self._scalar(handle, function, read(gpu) if gpu else None, ref)

    def _scalar(self, handle: Any, function: str, value: Any, ref: Any) -> int:
        def write(v: Any) -> None:
            _out(ref).value = int(v)

        return self._query(handle, function, value, write)

    # -- system ----------------------------------------------------------------------------------

    def _nvmlInitWithFlags(self, flags: Any) -> int:
        if self.init_error is not None:
            return self.init_error.code
        self.initialized += 1
        return SUCCESS

    def _nvmlInit_v2(self) -> int:
        return self._nvmlInitWithFlags(0)

    def _nvmlShutdown(self) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        self.initialized -= 1
        return SUCCESS

    def _nvmlErrorString(self, result: Any) -> bytes:
        return RETURN_CODES.get(_value(result), ("", b"Unknown Error"))[1]

    def _nvmlSystemGetDriverVersion(self, buffer: Any, length: Any) -> int:
        return _write_string(buffer, length, self.driver_version) if self.initialized else ERROR_UNINITIALIZED

    def _nvmlSystemGetNVMLVersion(self, buffer: Any, length: Any) -> int:
        return _write_string(buffer, length, self.nvml_version)

    def _nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        _out(ref).value = self.cuda_driver_version
        return SUCCESS

    def _nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        _out(ref).value = len(self.gpus)
        return SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        i = _value(index)
        if not 0 <= i < len(self.gpus):
            return ERROR_INVALID_ARGUMENT
        refused = self.gpus[i].errors.get("nvmlDeviceGetHandleByIndex_v2")
        if refused is not None:
            return refused.code
        _write_pointer(ref, HANDLE_BASE + i * 0x100)
        return SUCCESS

    # -- identity --------------------------------------------------------------------------------

    def _string_query(self, handle: Any, function: str, attr: str, buffer: Any, length: Any) -> int:
        mig = self._mig(handle)
        if mig is not None and attr in ("name", "uuid"):
            parent, device = mig
            text = device.get(attr) or (f"{parent.name} MIG" if attr == "name" else "")
            status = self._mig_query(handle, function, text, lambda v: None)
            return status if status != SUCCESS else _write_string(buffer, length, str(text))
        gpu = self._device(handle)
        text = getattr(gpu, attr) if gpu is not None else None
        status = self._query(handle, function, text, lambda v: None)
        return status if status != SUCCESS else _write_string(buffer, length, str(text))

    def _nvmlDeviceGetName(self, handle: Any, buffer: Any, length: Any) -> int:
        return self._string_query(handle, "nvmlDeviceGetName", "name", buffer, length)

    def _nvmlDeviceGetUUID(self, handle: Any, buffer: Any, length: Any) -> int:
        return self._string_query(handle, "nvmlDeviceGetUUID", "uuid", buffer, length)

    def _nvmlDeviceGetSerial(self, handle: Any, buffer: Any, length: Any) -> int:
        return self._string_query(handle, "nvmlDeviceGetSerial", "serial", buffer, length)

    def _nvmlDeviceGetVbiosVersion(self, handle: Any, buffer: Any, length: Any) -> int:
        return self._string_query(handle, "nvmlDeviceGetVbiosVersion", "vbios_version", buffer, length)

    def _nvmlDeviceGetPciInfo_v3(self, handle: Any, ref: Any) -> int:
        gpu = self._device(handle)

        def write(g: FakeGpu) -> None:
            info = _out(ref)
            info.busIdLegacy = f"{g.pci_domain:04X}:{g.pci_bus:02X}:{g.pci_device:02X}.0".encode()
            info.busId = g.bus_id.encode()
            info.domain, info.bus, info.device = g.pci_domain, g.pci_bus, g.pci_device
            info.pciDeviceId = g.pci_device_id
            info.pciSubSystemId = 0x16C110DE

        return self._query(handle, "nvmlDeviceGetPciInfo_v3", gpu, write)

    def _nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu = self._device(handle)

        def write(mode: int) -> None:
            _out(current).value = mode
            _out(pending).value = mode

        return self._query(handle, "nvmlDeviceGetMigMode", gpu.mig_mode if gpu else None, write)

    # -- telemetry -------------------------------------------------------------------------------

    def _nvmlDeviceGetUtilizationRates(self, handle: Any, ref: Any) -> int:
        gpu = self._device(handle)
        # nvml.h: utilization is not supported on MIG-enabled GPUs.
        value: Any = None if gpu is None or gpu.mig_mode == 1 else gpu.utilization_gpu
        if value is not None and not isinstance(value, NvmlReturn):
            value = gpu

        def write(g: FakeGpu) -> None:
            _out(ref).gpu = g.utilization_gpu
            _out(ref).memory = g.utilization_memory or 0

        return self._query(handle, "nvmlDeviceGetUtilizationRates", value, write)

    def _nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> int:
        mig = self._mig(handle)
        if mig is not None:  # a MIG device: its GPU instance's memory

            def write_mig(device: dict[str, Any]) -> None:
                info = _out(ref)
                info.total, info.used = int(device.get("memory_total", 0)), int(device.get("memory_used", 0))
                info.free = info.total - info.used

            return self._mig_query(handle, "nvmlDeviceGetMemoryInfo", mig[1], write_mig)
        gpu = self._device(handle)

        def write(g: FakeGpu) -> None:
            info = _out(ref)
            info.total = g.memory_total
            info.used = g.memory_used + _number(g.memory_reserved)  # v1 "used" = reserved + allocated
            info.free = g.memory_total - info.used

        return self._query(handle, "nvmlDeviceGetMemoryInfo", gpu, write)

    def _nvmlDeviceGetMemoryInfo_v2(self, handle: Any, ref: Any) -> int:
        gpu = self._device(handle)
        if gpu is not None and _out(ref).version != 0x02000028:
            return ERROR_ARGUMENT_VERSION_MISMATCH

        def write(g: FakeGpu) -> None:
            info = _out(ref)
            info.total, info.used = g.memory_total, g.memory_used
            info.reserved = _number(g.memory_reserved)
            info.free = g.memory_total - g.memory_used - info.reserved

        return self._query(handle, "nvmlDeviceGetMemoryInfo_v2", gpu, write)

    def _nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, ref: Any) -> int:
        gpu = self._device(handle)
        value = gpu.temperature if gpu and _value(sensor) == 0 else None
        return self._scalar(handle, "nvmlDeviceGetTemperature", value, ref)

    def _nvmlDeviceGetTemperatureV(self, handle: Any, ref: Any) -> int:
        gpu = self._device(handle)
        info = _out(ref)
        if info.version != 0x100000C:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        value = gpu.temperature if gpu and int(info.sensorType) == 0 else None

        def write(v: int) -> None:
            info.temperature = v

        return self._query(handle, "nvmlDeviceGetTemperatureV", value, write)

    def _nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: Any, ref: Any) -> int:
        gpu = self._device(handle)
        kind = _value(threshold)
        value = None
        if gpu is not None:
            value = {0: gpu.shutdown_temperature, 1: gpu.slowdown_temperature}.get(kind)
        return self._scalar(handle, "nvmlDeviceGetTemperatureThreshold", value, ref)

    def _clock(self, handle: Any, function: str, kind: Any, ref: Any, maximum: bool) -> int:
        gpu = self._device(handle)
        name = CLOCK_NAMES.get(_value(kind))
        value = None
        if gpu is not None and name is not None:
            value = _entry(gpu.max_clocks_mhz if maximum else gpu.clocks_mhz, name)
        return self._scalar(handle, function, value, ref)

    def _nvmlDeviceGetClockInfo(self, handle: Any, kind: Any, ref: Any) -> int:
        return self._clock(handle, "nvmlDeviceGetClockInfo", kind, ref, False)

    def _nvmlDeviceGetMaxClockInfo(self, handle: Any, kind: Any, ref: Any) -> int:
        return self._clock(handle, "nvmlDeviceGetMaxClockInfo", kind, ref, True)

    def _nvmlDeviceGetPcieThroughput(self, handle: Any, counter: Any, ref: Any) -> int:
        gpu = self._device(handle)
        value = None
        if gpu is not None:
            value = {0: gpu.pcie_tx_kbps, 1: gpu.pcie_rx_kbps}.get(_value(counter))
        return self._scalar(handle, "nvmlDeviceGetPcieThroughput", value, ref)

    def _nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, ref: Any) -> int:
        gpu = self._device(handle)
        value = None
        if gpu is not None and 0 <= _value(link) < len(gpu.nvlink_up):
            value = _link_state(gpu.nvlink_up[_value(link)])
        elif gpu is not None and not gpu.lost:
            return ERROR_INVALID_ARGUMENT
        return self._scalar(handle, "nvmlDeviceGetNvLinkState", value, ref)

    def _nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: Any, counter_type: Any, ref: Any) -> int:
        gpu = self._device(handle)
        kind = {0: "corrected", 1: "uncorrected"}.get(_value(error_type))
        scope = {0: "volatile", 1: "aggregate"}.get(_value(counter_type))
        value = None
        if gpu is not None and kind and scope:
            value = _entry(gpu.ecc, f"{kind}_{scope}")
        return self._scalar(handle, "nvmlDeviceGetTotalEccErrors", value, ref)

    def _nvmlDeviceGetRemappedRows(self, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any) -> int:
        gpu = self._device(handle)
        rows: Any = None if gpu is None or gpu.mig_mode == 1 else gpu.remapped_rows  # NotSupported with MIG
        if isinstance(rows, dict):
            rows = next((v for v in rows.values() if v is None or isinstance(v, NvmlReturn)), rows)

        def write(r: dict[str, int]) -> None:
            _out(corr).value, _out(unc).value = r["correctable"], r["uncorrectable"]
            _out(pending).value, _out(failure).value = r["pending"], r["failure"]

        return self._query(handle, "nvmlDeviceGetRemappedRows", rows, write)

    def _processes(self, handle: Any, function: str, count_ref: Any, infos: Any) -> int:
        gpu = self._device(handle)
        status = self._query(handle, function, gpu.processes if gpu and isinstance(gpu.processes, NvmlReturn) else gpu,
                             lambda g: None)
        if status != SUCCESS:
            return status
        assert gpu is not None and not isinstance(gpu.processes, NvmlReturn)
        count = _out(count_ref)
        needed = len(gpu.processes)
        if infos is None or count.value < needed:
            count.value = needed
            return SUCCESS if needed == 0 else ERROR_INSUFFICIENT_SIZE
        for slot, (pid, used, *instance) in enumerate(gpu.processes):  # [pid, used bytes, MIG GPU instance]
            infos[slot].pid = pid
            infos[slot].usedGpuMemory = VALUE_NOT_AVAILABLE if used is None else used
            infos[slot].gpuInstanceId = instance[0] if instance and instance[0] is not None else NO_INSTANCE
            infos[slot].computeInstanceId = 0 if instance and instance[0] is not None else NO_INSTANCE
        count.value = needed
        return SUCCESS

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v3", count, infos)

    def _nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v2", count, infos)

    # -- batched field values --------------------------------------------------------------------

    def _field(self, gpu: FakeGpu, field_id: int, scope: int) -> tuple[int, Any]:
        """(value type, value) of one field, read from where the field table says the GPU keeps it;
        raises :class:`Refused` with the code it answers instead."""
        if field_id > self.max_field_id:
            raise Refused(ERROR_NOT_SUPPORTED)
        if f"field:{field_id}" in gpu.errors:
            raise Refused(gpu.errors[f"field:{field_id}"].code)
        known = FIELDS_BY_ID.get(field_id)
        value: Any = None
        value_type = VALUE_TYPE_ULL
        if known is None:
            pass
        elif field_id == FI_DEV_NVLINK_LINK_COUNT:
            value = len(gpu.nvlink_up) or None
        elif known.per_link and known.all_links and scope == SCOPE_ALL_LINKS:  # the driver sums the links
            attr, key = known.home
            links: list[Any] = getattr(gpu, attr)[key]
            refused = next((v for v in links if v is None or isinstance(v, NvmlReturn)), 0)
            value = sum(links) if links and refused == 0 else (refused if links else None)
        elif known.per_link:
            if 0 <= scope < len(gpu.nvlink_up):
                attr, key = known.home
                per_link: Any = getattr(gpu, attr) if key is None else getattr(gpu, attr)[key]
                value = per_link[scope]
                if field_id == FI_DEV_NVLINK_GET_STATE:
                    value, value_type = _link_state(value), VALUE_TYPE_UINT
        elif known.home[0] == "nvlink_error_totals":
            value = gpu.nvlink_total(str(known.home[1]))
        else:
            attr, key = known.home
            # nvml.h: row remapping is not supported on MIG-enabled GPUs, its fields neither
            state = None if attr == "remapped_rows" and gpu.mig_mode == 1 else getattr(gpu, attr)
            value = state if key is None else _entry(state, key)
        if value is None:
            raise Refused(ERROR_NOT_SUPPORTED)
        if isinstance(value, NvmlReturn):
            raise Refused(value.code)
        return value_type, int(value)

    def _nvmlDeviceGetFieldValues(self, handle: Any, count: Any, ref: Any) -> int:
        def write(gpu: FakeGpu) -> None:
            values = _out(ref)
            now_us = int(time.time() * 1e6)
            for i in range(_value(count)):
                slot = values[i]
                self.fields_asked[int(slot.fieldId)] += 1
                slot.timestamp = now_us
                try:
                    value_type, value = self._field(gpu, int(slot.fieldId), int(slot.scopeId))
                except Refused as refused:
                    slot.nvmlReturn = refused.code
                    slot.latencyUsec = self._field_latency(int(slot.fieldId), False)
                    continue
                slot.latencyUsec = self._field_latency(int(slot.fieldId), True)
                slot.nvmlReturn = SUCCESS
                slot.valueType = value_type
                if value_type == VALUE_TYPE_UINT:
                    slot.value.uiVal = value
                else:
                    slot.value.ullVal = value

        return self._query(handle, "nvmlDeviceGetFieldValues", self._device(handle), write)

    def _field_latency(self, field_id: int, answered: bool) -> int:
        """``latencyUsec`` as the driver reports it: what the model charges the field (0 without a model)."""
        return 0 if self.latency is None else round(self.latency.field_cost_us(field_id, answered))

    # -- fabric ----------------------------------------------------------------------------------

    def _fabric(self, handle: Any, function: str, ref: Any, versioned: bool) -> int:
        gpu = self._device(handle)
        info = _out(ref)
        if versioned and info.version not in (FABRIC_INFO_V2, FABRIC_INFO_V3):
            return ERROR_ARGUMENT_VERSION_MISMATCH

        def write(fabric: dict[str, Any]) -> None:
            state = int(fabric.get("state", FABRIC_STATE_COMPLETED))
            status = fabric.get("status", 0)
            info.state = state
            info.status = status.code if isinstance(status, NvmlReturn) else int(status)
            info.cliqueId = int(fabric.get("clique_id", 0))
            raw = bytes.fromhex(str(fabric.get("cluster_uuid", "")).replace("-", "")).ljust(16, b"\0")[:16]
            ctypes.memmove(info.clusterUuid, raw, 16)
            if versioned:
                info.healthMask = int(fabric.get("health_mask", 0))
            if versioned and info.version == FABRIC_INFO_V3:
                info.healthSummary = int(fabric.get("health_summary", 0))

        return self._query(handle, function, None if gpu is None else gpu.fabric, write)

    def _nvmlDeviceGetGpuFabricInfoV(self, handle: Any, ref: Any) -> int:
        return self._fabric(handle, "nvmlDeviceGetGpuFabricInfoV", ref, True)

    def _nvmlDeviceGetGpuFabricInfo(self, handle: Any, ref: Any) -> int:
        return self._fabric(handle, "nvmlDeviceGetGpuFabricInfo", ref, False)

    # -- MIG -------------------------------------------------------------------------------------

    def _mig(self, handle: Any) -> tuple[FakeGpu, dict[str, Any]] | None:
        """(parent GPU, MIG device) for a MIG device's handle, while its GPU has MIG enabled."""
        try:
            offset = _address(handle) - MIG_HANDLE_BASE
        except (ctypes.ArgumentError, TypeError):
            return None
        index, slot = offset // 0x1000, (offset % 0x1000) // 0x10
        if offset < 0 or not 0 <= index < len(self.gpus) or offset != index * 0x1000 + slot * 0x10:
            return None
        device = self.gpus[index].mig_slot(slot)
        return None if device is None else (self.gpus[index], device)

    def _mig_query(self, handle: Any, function: str, value: Any, writer: Callable[[Any], None]) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        mig = self._mig(handle)
        if mig is None:
            return ERROR_INVALID_ARGUMENT
        if mig[0].lost:
            return ERROR_GPU_IS_LOST
        if function in mig[0].errors:
            return mig[0].errors[function].code
        if value is None:
            return ERROR_NOT_SUPPORTED
        writer(value)
        return SUCCESS

    def _nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, ref: Any) -> int:
        gpu = self._device(handle)
        return self._scalar(handle, "nvmlDeviceGetMaxMigDeviceCount", gpu.max_mig_devices if gpu else None, ref)

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, ref: Any) -> int:
        gpu = self._device(handle)
        slot = _value(index)

        def write(g: FakeGpu) -> None:
            _write_pointer(ref, MIG_HANDLE_BASE + g.index * 0x1000 + slot * 0x10)

        status = self._query(handle, "nvmlDeviceGetMigDeviceHandleByIndex",
                             None if gpu is None or gpu.max_mig_devices is None else gpu, lambda g: None)
        if status != SUCCESS:
            return status
        assert gpu is not None
        if not isinstance(gpu.max_mig_devices, int) or not 0 <= slot < max(gpu.max_mig_devices, 1):
            return ERROR_INVALID_ARGUMENT
        if gpu.mig_slot(slot) is None:  # nvml.h: "no valid MIG device was found at index" (an H200 with MIG
            return ERROR_NOT_FOUND      # disabled answered so for index 0)
        write(gpu)
        return SUCCESS

    def _instance_id(self, handle: Any, function: str, key: str, ref: Any) -> int:
        if self._mig(handle) is None:  # a whole GPU's handle
            gpu = self._device(handle)
            status = self._query(handle, function, gpu, lambda g: None)
            return ERROR_INVALID_ARGUMENT if status == SUCCESS else status
        mig = self._mig(handle)
        assert mig is not None

        def write(device: dict[str, Any]) -> None:
            _out(ref).value = int(device[key])

        return self._mig_query(handle, function, mig[1], write)

    def _nvmlDeviceGetGpuInstanceId(self, handle: Any, ref: Any) -> int:
        return self._instance_id(handle, "nvmlDeviceGetGpuInstanceId", "gpu_instance", ref)

    def _nvmlDeviceGetComputeInstanceId(self, handle: Any, ref: Any) -> int:
        return self._instance_id(handle, "nvmlDeviceGetComputeInstanceId", "compute_instance", ref)

    def _nvmlDeviceIsMigDeviceHandle(self, handle: Any, ref: Any) -> int:
        if self._mig(handle) is not None:
            return self._mig_query(handle, "nvmlDeviceIsMigDeviceHandle", 1, lambda v: setattr(_out(ref), "value", 1))
        return self._query(handle, "nvmlDeviceIsMigDeviceHandle", self._device(handle),
                           lambda g: setattr(_out(ref), "value", 0))

    def _nvmlGpmMigSampleGet(self, handle: Any, gpu_instance: Any, sample: Any) -> int:
        gpu = self._device(handle)
        address = _address(sample)
        if address not in self._samples:
            return ERROR_INVALID_ARGUMENT
        gi = _value(gpu_instance)
        status = self._query(handle, "nvmlGpmMigSampleGet", None if gpu is None or gpu.gpm is None else gpu,
                             lambda g: None)
        if status != SUCCESS:
            return status
        assert gpu is not None
        device = next((d for d in gpu.mig_devices if d["gpu_instance"] == gi), None) if gpu.mig_mode == 1 else None
        if device is None:
            return ERROR_INVALID_ARGUMENT
        gpm = device.get("gpm")
        if gpm is None or isinstance(gpm, NvmlReturn):
            return ERROR_NOT_SUPPORTED if gpm is None else gpm.code
        self._samples[address] = {"gpu": (gpu.index, gi), "time": time.monotonic(), "gpm": dict(gpm)}
        return SUCCESS

    # -- GPM -------------------------------------------------------------------------------------

    def _nvmlGpmQueryDeviceSupport(self, handle: Any, ref: Any) -> int:
        gpu = self._device(handle)

        def write(g: FakeGpu) -> None:
            _out(ref).isSupportedDevice = 1 if g.gpm is not None and g.architecture in ("hopper", "blackwell") else 0

        return self._query(handle, "nvmlGpmQueryDeviceSupport", gpu, write)

    def _nvmlGpmSampleAlloc(self, ref: Any) -> int:
        with self._calls_lock:
            self._next_sample += 1
            address = SAMPLE_BASE + self._next_sample * 0x100
        self._samples[address] = None
        _write_pointer(ref, address)
        return SUCCESS

    def _nvmlGpmSampleFree(self, sample: Any) -> int:
        return SUCCESS if self._samples.pop(_address(sample), "absent") != "absent" else ERROR_INVALID_ARGUMENT

    def _nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        gpu = self._device(handle)
        address = _address(sample)
        if address not in self._samples:
            return ERROR_INVALID_ARGUMENT

        def write(g: FakeGpu) -> None:
            self._samples[address] = {"gpu": g.index, "time": time.monotonic(), "gpm": g.gpm_metrics()}

        value: Any = None if gpu is None else (gpu.gpm if isinstance(gpu.gpm, NvmlReturn) else gpu)
        if gpu is not None and gpu.gpm is None:
            value = None
        return self._query(handle, "nvmlGpmSampleGet", value, write)

    def _nvmlGpmMetricsGet(self, ref: Any) -> int:
        request = _out(ref)
        if request.version != 1:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        first = self._samples.get(_address(request.sample1))
        second = self._samples.get(_address(request.sample2))
        if not first or not second or first["gpu"] != second["gpu"]:
            return ERROR_INVALID_ARGUMENT
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            name = _gpm_key(int(metric.metricId))
            answer = second["gpm"].get(name) if name is not None else None
            if answer is None or isinstance(answer, NvmlReturn):
                metric.nvmlReturn = ERROR_NOT_SUPPORTED if answer is None else answer.code
                continue
            metric.nvmlReturn = SUCCESS
            metric.value = float(answer)  # percent 0-100 (PCIe: MiB/s), over the interval between the samples
        return SUCCESS

    # -- events ----------------------------------------------------------------------------------

    def _nvmlEventSetCreate(self, ref: Any) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        with self._events:
            self._next_set += 1
            address = SET_BASE + self._next_set * 0x100
            self._sets[address] = {"registered": {}, "queue": deque()}
        _write_pointer(ref, address)
        return SUCCESS

    def _nvmlEventSetFree(self, event_set: Any) -> int:
        with self._events:
            return SUCCESS if self._sets.pop(_address(event_set), None) is not None else ERROR_INVALID_ARGUMENT

    def _nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        gpu = self._device(handle)
        wanted = _value(types)
        with self._events:
            target = self._sets.get(_address(event_set))
            if target is None:
                return ERROR_INVALID_ARGUMENT
            if gpu is not None and isinstance(gpu.supported_events, int) and wanted & ~gpu.supported_events:
                return ERROR_NOT_SUPPORTED  # nvml.h: "some of requested event types" unsupported

            def write(g: FakeGpu) -> None:
                target["registered"][g.index] = target["registered"].get(g.index, 0) | wanted
                for pending in [p for p in self.pending_events if p[0] == g.index and p[1] & wanted]:
                    self.pending_events.remove(pending)
                    target["queue"].append(pending)

            return self._query(handle, "nvmlDeviceRegisterEvents", gpu, write)

    def _nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout_ms: Any) -> int:
        deadline = time.monotonic() + _value(timeout_ms) / 1000.0
        with self._events:
            while True:
                target = self._sets.get(_address(event_set))
                if target is None:
                    return ERROR_INVALID_ARGUMENT
                if any(self.gpus[i].lost for i in target["registered"]):
                    return ERROR_GPU_IS_LOST
                if target["queue"]:
                    index, event_type, data = target["queue"].popleft()
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return ERROR_TIMEOUT
                self._waiting[_address(event_set)] += 1
                self._quiet.notify_all()  # for settle(): one more watcher back in its wait
                try:
                    self._events.wait(remaining)
                finally:
                    self._waiting[_address(event_set)] -= 1
        out = _out(ref)
        ctypes.c_void_p.from_buffer(out, 0).value = HANDLE_BASE + index * 0x100
        out.eventType = event_type
        out.eventData = data
        out.gpuInstanceId = 0xFFFFFFFF
        out.computeInstanceId = 0xFFFFFFFF
        return SUCCESS


def _gpm_key(metric_id: int) -> str | None:
    """Where a GPM metric's answer is kept in a sample's ``gpm`` (None: a metric the fake does not model)."""
    if metric_id in GPM_NVLINK_KEYS:
        link, direction = GPM_NVLINK_KEYS[metric_id]
        return f"nvlink_{direction}" if link is None else f"nvlink_{direction}_{link}"
    return GPM_METRICS.get(metric_id) or GPM_PCIE_KEYS.get(metric_id)


def set_native_library(library: FakeNvml | None, binding: Any = None) -> None:
    """Put ``library`` where ``pynvml`` keeps its loaded ``libnvidia-ml`` (None: nothing loaded).

    pynvml's internals, the one place the fake touches them: the module global ``nvmlLib`` under
    ``libLoadLock``, the symbol cache ``_nvmlGetFunctionPointer_cache`` and the init refcount
    ``_nvmlLib_refcount`` (nvidia-ml-py 12 and 13; sim/pyproject.toml bounds the binding).
    ``binding``: a module from :func:`private_binding` (default: the imported ``pynvml``).
    """
    pynvml: Any = binding if binding is not None else importlib.import_module("pynvml")
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def private_binding(fake: FakeNvml) -> Any:
    """A copy of the real ``pynvml`` module of its own (its own ``nvmlLib``, symbol cache and refcount), loaded
    with ``fake``: one NVML per simulated node in one process, where the imported module is one per process.
    The binding's code is the same; only its module globals are not shared."""
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.loader is None:
        raise ImportError("nvidia-ml-py (pynvml) is not installed")
    module = importlib.util.module_from_spec(spec)
    shared = sys.modules.get("pynvml")
    sys.modules["pynvml"] = module  # the binding finds itself there while it defines its error classes
    try:
        spec.loader.exec_module(module)
    finally:
        if shared is None:
            del sys.modules["pynvml"]
        else:
            sys.modules["pynvml"] = shared
    set_native_library(fake, module)
    return module


def install(fake: FakeNvml) -> None:
    """Make ``pynvml`` use ``fake`` as its native library."""
    set_native_library(fake)


def uninstall() -> None:
    """Back to "no library loaded"; the next ``nvmlInit`` looks for the real one."""
    set_native_library(None)


class installed:
    """Context manager: ``with installed(fake): ...`` installs and always uninstalls."""

    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake

    def __enter__(self) -> FakeNvml:
        install(self.fake)
        return self.fake

    def __exit__(self, *exc: object) -> None:
        self.fake.release()
        uninstall()
