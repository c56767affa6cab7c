"""The facts of ``nvml.h`` fleetscope relies on, in one place: return codes, field ids and the one field
table, event and clocks-event bits, clock types, GPM metric ids, architecture numbers.

The reader (:mod:`fleetscope.sources.nvml`), ``fleetscope capture`` (:mod:`fleetscope.capture.nvml`) and
the NVML fake of the simulator distribution (``fleetscope_sim.nvml_fake``) all read these tables; none of
them spells an NVML number of its own. Names are the header's without its ``NVML_`` prefix
(``ERROR_NOT_SUPPORTED``, ``FI_DEV_REMAPPED_COR``), values are the header's; ``tests/sources/test_nvml_h.py``
checks every one against the ``nvidia-ml-py`` binding, which mirrors the header.

:data:`FIELDS` is the field table: per field id, the reading value it becomes (with its extra labels)
and where the fake keeps it. The reader asks for exactly these ids, the capture records exactly these,
the fake answers exactly these, so a field added here is read, captured and replayed, or a test fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the reader's value names; the reader imports this module
    from fleetscope.sources.nvml import NvmlValue

# nvmlReturn_t codes
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_TIMEOUT = 10
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

# nvmlReturn_t: name and the text nvmlErrorString gives for it.
RETURN_CODES: dict[int, tuple[str, bytes]] = {
    SUCCESS: ("NVML_SUCCESS", b"Success"),
    ERROR_UNINITIALIZED: ("NVML_ERROR_UNINITIALIZED", b"Uninitialized"),
    ERROR_INVALID_ARGUMENT: ("NVML_ERROR_INVALID_ARGUMENT", b"Invalid Argument"),
    ERROR_NOT_SUPPORTED: ("NVML_ERROR_NOT_SUPPORTED", b"Not Supported"),
    ERROR_NO_PERMISSION: ("NVML_ERROR_NO_PERMISSION", b"Insufficient Permissions"),
    5: ("NVML_ERROR_ALREADY_INITIALIZED", b"Already Initialized"),
    ERROR_NOT_FOUND: ("NVML_ERROR_NOT_FOUND", b"Not Found"),
    ERROR_INSUFFICIENT_SIZE: ("NVML_ERROR_INSUFFICIENT_SIZE", b"Insufficient Size"),
    8: ("NVML_ERROR_INSUFFICIENT_POWER", b"Insufficient External Power"),
    9: ("NVML_ERROR_DRIVER_NOT_LOADED", b"Driver Not Loaded"),
    ERROR_TIMEOUT: ("NVML_ERROR_TIMEOUT", b"Timeout"),
    11: ("NVML_ERROR_IRQ_ISSUE", b"Interrupt Request Issue"),
    12: ("NVML_ERROR_LIBRARY_NOT_FOUND", b"NVML Shared Library Not Found"),
    ERROR_FUNCTION_NOT_FOUND: ("NVML_ERROR_FUNCTION_NOT_FOUND", b"Function Not Found"),
    14: ("NVML_ERROR_CORRUPTED_INFOROM", b"Corrupted infoROM"),
    ERROR_GPU_IS_LOST: ("NVML_ERROR_GPU_IS_LOST", b"GPU is lost"),
    16: ("NVML_ERROR_RESET_REQUIRED", b"GPU requires restart"),
    17: ("NVML_ERROR_OPERATING_SYSTEM", b"The operating system has blocked the request"),
    18: ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", b"RM has detected an NVML/RM version mismatch"),
    19: ("NVML_ERROR_IN_USE", b"In use by another client"),
    20: ("NVML_ERROR_MEMORY", b"Insufficient Memory"),
    21: ("NVML_ERROR_NO_DATA", b"No data"),
    22: ("NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", b"ECC is not supported on vGPU"),
    23: ("NVML_ERROR_INSUFFICIENT_RESOURCES", b"Insufficient resources"),
    24: ("NVML_ERROR_FREQ_NOT_SUPPORTED", b"Frequency not supported"),
    ERROR_ARGUMENT_VERSION_MISMATCH: ("NVML_ERROR_ARGUMENT_VERSION_MISMATCH", b"Argument version mismatch"),
    26: ("NVML_ERROR_DEPRECATED", b"Deprecated"),
    27: ("NVML_ERROR_NOT_READY", b"Not ready"),
    28: ("NVML_ERROR_GPU_NOT_FOUND", b"GPU not found"),
    29: ("NVML_ERROR_INVALID_STATE", b"Invalid state"),
    ERROR_UNKNOWN: ("NVML_ERROR_UNKNOWN", b"Unknown Error"),
}
_CODES_BY_NAME = {name: code for code, (name, _) in RETURN_CODES.items()}


@dataclass(frozen=True)
class NvmlReturn:
    """One ``nvmlReturn_t`` code, named as in nvml.h (the fake's scenarios and the capture write the name)."""

    code: int

    @classmethod
    def named(cls, name: str) -> NvmlReturn:
        """``NVML_ERROR_NO_PERMISSION`` -> its code."""
        if name not in _CODES_BY_NAME:
            raise ValueError(f"not an NVML return code: {name!r}")
        return cls(_CODES_BY_NAME[name])

    @property
    def name(self) -> str:
        return RETURN_CODES.get(self.code, (f"NVML_ERROR_{self.code}", b""))[0]

    def __str__(self) -> str:
        return self.name


# Field ids (nvmlFieldValue_t.fieldId): NVML_FI_DEV_*
FI_DEV_ECC_SBE_VOL_TOTAL = 3
FI_DEV_ECC_DBE_VOL_TOTAL = 4
FI_DEV_ECC_SBE_AGG_TOTAL = 5
FI_DEV_ECC_DBE_AGG_TOTAL = 6
FI_DEV_RETIRED_SBE = 29
FI_DEV_RETIRED_DBE = 30
FI_DEV_RETIRED_PENDING = 31
FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP = 74  # was NVML_FI_DEV_PERF_POLICY_POWER
FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST = 76  # was NVML_FI_DEV_PERF_POLICY_SYNC_BOOST
FI_DEV_MEMORY_TEMP = 82
FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
FI_DEV_NVLINK_LINK_COUNT = 91
FI_DEV_PCIE_REPLAY_COUNTER = 94
FI_DEV_REMAPPED_COR = 142
FI_DEV_REMAPPED_UNC = 143
FI_DEV_REMAPPED_PENDING = 144
FI_DEV_REMAPPED_FAILURE = 145
FI_DEV_NVLINK_ERROR_DL_REPLAY = 161
FI_DEV_NVLINK_ERROR_DL_RECOVERY = 162
FI_DEV_NVLINK_ERROR_DL_CRC = 163
FI_DEV_NVLINK_GET_STATE = 165
FI_DEV_GET_GPU_RECOVERY_ACTION = 230
FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN = 269
FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN = 270
FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN = 271
FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38  # all links (scope 0)
FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER = 95
FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS = 173
FI_DEV_PCIE_COUNT_NAKS_RECEIVED = 174
FI_DEV_PCIE_COUNT_BAD_TLP = 176
FI_DEV_PCIE_COUNT_NAKS_SENT = 177
FI_DEV_PCIE_COUNT_BAD_DLLP = 178
FI_DEV_PCIE_COUNT_NON_FATAL_ERROR = 179
FI_DEV_PCIE_COUNT_FATAL_ERROR = 180
FI_DEV_PCIE_COUNT_TX_BYTES = 197
FI_DEV_PCIE_COUNT_RX_BYTES = 198
FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138  # KiB of data sent over a link (scopeId: the link; SCOPE_ALL_LINKS: all)
FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
# nvml.h: "A scopeId of UINT_MAX returns aggregate value summed up across all links" (the throughput fields)
SCOPE_ALL_LINKS = 0xFFFFFFFF

# How often the reader asks a value (fleetscope.sources.nvml): once per GPU (and after a reset), every
# slow interval, or every collection. Every field here is ``slow`` but the NVLink link count, a constant:
# a GPU's batch costs what its dear fields cost on an H100 (driver 580): energy 3.5 ms, the hardware
# throttle times 0.7-0.9 ms, the PCIe counters 0.1-0.3 ms each; the error states among the cheap ones
# (ECC, row remapping, recovery action: 2-10 µs) are read at once when NVML posts the event that moves them.
Cost = Literal["constant", "slow", "fast"]
# At which --collector.gpu.detail level the reader asks a field: both, or only one (the all-link NVLink
# totals stand for the per-link counters at the default level, which sums links anyway).
Detail = Literal["any", "default", "all"]


@dataclass(frozen=True)
class Field:
    """One field fleetscope reads with ``nvmlDeviceGetFieldValues``.

    ``value`` and ``labels``: what the reader makes of it (None: it steers the read, like the link
    count). ``home``: where the NVML fake keeps it, a ``FakeGpu`` attribute and the key within it
    (None: the attribute itself); the capture writes the answer there. ``per_link``: scoped by NVLink
    (``scopeId`` is the link), asked once per link the GPU has. ``cost``: how often the reader asks it;
    ``detail``: at which detail level. ``all_links``: a per-link field the driver also sums over every link
    (scope :data:`SCOPE_ALL_LINKS`): at the default level it is asked once so, not once per link.
    """

    id: int
    value: NvmlValue | None
    labels: tuple[str, ...]
    home: tuple[str, str | None]
    per_link: bool = False
    cost: Cost = "slow"
    detail: Detail = "any"
    all_links: bool = False


FIELDS: tuple[Field, ...] = (
    Field(FI_DEV_ECC_SBE_VOL_TOTAL, "ecc_errors", ("corrected", "volatile"), ("ecc", "corrected_volatile")),
    Field(FI_DEV_ECC_DBE_VOL_TOTAL, "ecc_errors", ("uncorrected", "volatile"), ("ecc", "uncorrected_volatile")),
    Field(FI_DEV_ECC_SBE_AGG_TOTAL, "ecc_errors", ("corrected", "aggregate"), ("ecc", "corrected_aggregate")),
    Field(FI_DEV_ECC_DBE_AGG_TOTAL, "ecc_errors", ("uncorrected", "aggregate"), ("ecc", "uncorrected_aggregate")),
    Field(FI_DEV_RETIRED_SBE, "retired_pages", ("single_bit",), ("retired_pages_sbe", None)),
    Field(FI_DEV_RETIRED_DBE, "retired_pages", ("double_bit",), ("retired_pages_dbe", None)),
    Field(FI_DEV_RETIRED_PENDING, "retired_pages_pending", (), ("retired_pages_pending", None)),
    Field(FI_DEV_MEMORY_TEMP, "memory_temperature", (), ("memory_temperature", None)),
    Field(FI_DEV_TOTAL_ENERGY_CONSUMPTION, "energy", (), ("energy_mj", None)),
    Field(FI_DEV_PCIE_REPLAY_COUNTER, "pcie_replays", (), ("pcie_replays", None)),
    Field(FI_DEV_REMAPPED_COR, "remapped_rows", ("correctable",), ("remapped_rows", "correctable")),
    Field(FI_DEV_REMAPPED_UNC, "remapped_rows", ("uncorrectable",), ("remapped_rows", "uncorrectable")),
    Field(FI_DEV_REMAPPED_PENDING, "row_remap_pending", (), ("remapped_rows", "pending")),
    Field(FI_DEV_REMAPPED_FAILURE, "row_remap_failed", (), ("remapped_rows", "failure")),
    # throttle durations (ns), labelled by the reason of THROTTLE_BITS
    Field(FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP, "throttle_seconds", ("sw_power_cap",),
          ("throttle_ns", "sw_power_cap")),
    Field(FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST, "throttle_seconds", ("sync_boost",), ("throttle_ns", "sync_boost")),
    Field(FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, "throttle_seconds", ("sw_thermal",),
          ("throttle_ns", "sw_thermal")),
    Field(FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN, "throttle_seconds", ("hw_thermal",),
          ("throttle_ns", "hw_thermal")),
    Field(FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN, "throttle_seconds", ("hw_power_brake",),
          ("throttle_ns", "hw_power_brake")),
    Field(FI_DEV_GET_GPU_RECOVERY_ACTION, "recovery_action", (), ("recovery_action", None)),
    # PCIe: errors by severity, the data-link events behind them (detail=all), and the bytes moved, which
    # the reader asks only of a GPU whose GPM gives no PCIe rates (PCIE_BYTE_FIELDS)
    Field(FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS, "pcie_errors", ("correctable",), ("pcie_errors", "correctable")),
    Field(FI_DEV_PCIE_COUNT_NON_FATAL_ERROR, "pcie_errors", ("non_fatal",), ("pcie_errors", "non_fatal")),
    Field(FI_DEV_PCIE_COUNT_FATAL_ERROR, "pcie_errors", ("fatal",), ("pcie_errors", "fatal")),
    Field(FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER, "pcie_link_events", ("replay_rollover",),
          ("pcie_errors", "replay_rollover"), detail="all"),
    Field(FI_DEV_PCIE_COUNT_NAKS_RECEIVED, "pcie_link_events", ("nak_received",), ("pcie_errors", "nak_received"),
          detail="all"),
    Field(FI_DEV_PCIE_COUNT_NAKS_SENT, "pcie_link_events", ("nak_sent",), ("pcie_errors", "nak_sent"), detail="all"),
    Field(FI_DEV_PCIE_COUNT_BAD_TLP, "pcie_link_events", ("bad_tlp",), ("pcie_errors", "bad_tlp"), detail="all"),
    Field(FI_DEV_PCIE_COUNT_BAD_DLLP, "pcie_link_events", ("bad_dllp",), ("pcie_errors", "bad_dllp"), detail="all"),
    Field(FI_DEV_PCIE_COUNT_TX_BYTES, "pcie_bytes", ("tx",), ("pcie_tx_bytes", None)),
    Field(FI_DEV_PCIE_COUNT_RX_BYTES, "pcie_bytes", ("rx",), ("pcie_rx_bytes", None)),
    # NVLink: the link count says how many links the per-link fields are asked for
    Field(FI_DEV_NVLINK_LINK_COUNT, None, (), ("nvlink_up", None), cost="constant"),
    Field(FI_DEV_NVLINK_GET_STATE, "nvlink_up", (), ("nvlink_up", None), per_link=True),
    Field(FI_DEV_NVLINK_ERROR_DL_REPLAY, "nvlink_errors", ("replay",), ("nvlink_errors", "replay"), per_link=True,
          detail="all"),
    Field(FI_DEV_NVLINK_ERROR_DL_RECOVERY, "nvlink_errors", ("recovery",), ("nvlink_errors", "recovery"),
          per_link=True, detail="all"),
    Field(FI_DEV_NVLINK_ERROR_DL_CRC, "nvlink_errors", ("crc",), ("nvlink_errors", "crc"), per_link=True,
          detail="all"),
    # ... and at the default level, which sums the GPU's links, the all-link totals: 4 fields for 54 on an
    # H100 (the reader falls back to the per-link ones where a driver lacks them). CRC: flit and data CRC.
    Field(FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, "nvlink_errors", ("replay",), ("nvlink_error_totals", "replay"),
          detail="default"),
    Field(FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, "nvlink_errors", ("recovery",),
          ("nvlink_error_totals", "recovery"), detail="default"),
    Field(FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, "nvlink_errors", ("crc",), ("nvlink_error_totals", "crc_flit"),
          detail="default"),
    Field(FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, "nvlink_errors", ("crc",), ("nvlink_error_totals", "crc_data"),
          detail="default"),
    # NVLink data bytes (KiB counters): asked only of a GPU whose GPM gives no NVLink rates (NVLINK_BYTE_FIELDS),
    # summed by the driver at the default level, per link at detail=all
    Field(FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "nvlink_bytes", ("tx",), ("nvlink_kib", "tx"), per_link=True,
          all_links=True),
    Field(FI_DEV_NVLINK_THROUGHPUT_DATA_RX, "nvlink_bytes", ("rx",), ("nvlink_kib", "rx"), per_link=True,
          all_links=True),
)
FIELDS_BY_ID = {field.id: field for field in FIELDS}
# Asked in the first batch, per GPU (the link count among them); the per-link ones follow per link.
GPU_FIELDS = tuple(field for field in FIELDS if not field.per_link)
LINK_FIELDS = tuple(field for field in FIELDS if field.per_link)
PCIE_BYTE_FIELDS = (FI_DEV_PCIE_COUNT_TX_BYTES, FI_DEV_PCIE_COUNT_RX_BYTES)
NVLINK_BYTE_FIELDS = (FI_DEV_NVLINK_THROUGHPUT_DATA_TX, FI_DEV_NVLINK_THROUGHPUT_DATA_RX)

# nvmlEventType* bits
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
EVENT_SINGLE_BIT_ECC_STORM = 0x200
EVENT_DRAM_RETIREMENT = 0x400
EVENT_DRAM_RETIREMENT_FAILURE = 0x800
EVENT_GPU_UNAVAILABLE = 0x4000
EVENT_RECOVERY_ACTION = 0x8000
# The error events worth a watch besides Xid: ECC, retirement, unavailability, recovery action.
WATCHED_EVENTS = (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID | EVENT_SINGLE_BIT_ECC_STORM
                  | EVENT_DRAM_RETIREMENT | EVENT_DRAM_RETIREMENT_FAILURE | EVENT_GPU_UNAVAILABLE
                  | EVENT_RECOVERY_ACTION)

# nvmlClocksEventReason* bits (the older name: nvmlClocksThrottleReason*), by the reason label fleetscope uses.
THROTTLE_BITS = {
    "gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sync_boost": 0x10,
    "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80, "display_clocks": 0x100,
}

# nvmlClockType_t
CLOCK_TYPES = {"graphics": 0, "sm": 1, "memory": 2}

# nvmlGpmMetricId_t -> the reading's value: the ratios the GPU collector reads (percent over the interval
# between two samples): NVML_GPM_METRIC_SM_UTIL, _SM_OCCUPANCY, _ANY_TENSOR_UTIL, _DRAM_BW_UTIL.
GPM_METRICS: dict[int, NvmlValue] = {2: "sm_active", 3: "sm_occupancy", 5: "tensor_active", 10: "dram_active"}
# NVML_GPM_METRIC_PCIE_{TX,RX}_PER_SEC (MiB/s) -> the direction label of the PCIe throughput
GPM_PCIE = {20: "tx", 21: "rx"}
# NVML_GPM_METRIC_NVLINK_TOTAL_{RX,TX}_PER_SEC (MiB/s, all links) -> the direction label
GPM_NVLINK_TOTAL = {60: "rx", 61: "tx"}
GPM_NVLINK_MAX_LINKS = 36  # NVML_GPM_METRIC_NVLINK_L<n>_{RX,TX}_PER_SEC exist for links 0-35


def gpm_nvlink_link_metrics(link: int) -> dict[int, str]:
    """NVML_GPM_METRIC_NVLINK_L<link>_{RX,TX}_PER_SEC (MiB/s) -> direction: links 0-17 from id 62, 18-35 from 212."""
    first = 62 + 2 * link if link < 18 else 212 + 2 * (link - 18)
    return {first: "rx", first + 1: "tx"}


# nvmlGpuFabricState_t (NVML_GPU_FABRIC_STATE_*): the GPU's registration with the NVLink fabric (Fabric Manager)
FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_IN_PROGRESS = 2
FABRIC_STATE_COMPLETED = 3
FABRIC_STATES = {FABRIC_STATE_NOT_SUPPORTED: "not_supported", FABRIC_STATE_NOT_STARTED: "not_started",
                 FABRIC_STATE_IN_PROGRESS: "in_progress", FABRIC_STATE_COMPLETED: "completed"}
# nvmlGpuFabricInfo_v2 / _v3: the struct versions nvmlDeviceGetGpuFabricInfoV takes
FABRIC_INFO_V2 = 0x02000024
FABRIC_INFO_V3 = 0x03000028
# nvmlGpuInstanceId / computeInstanceId of a process or an event that no MIG instance owns
NO_INSTANCE = 0xFFFFFFFF

# nvmlDeviceArchitecture_t (NVML_DEVICE_ARCH_*)
ARCHITECTURES = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
                 9: "hopper", 10: "blackwell"}
ARCHITECTURE_NUMBERS = {name: number for number, name in ARCHITECTURES.items()}
