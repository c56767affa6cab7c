"""The facts of ``nvml.h`` fleetscope relies on, in one place: return codes, event and clocks-event bits,
clock types, GPM metric ids, architecture numbers.

The reader (:mod:`fleetscope.sources.nvml`), ``fleetscope capture`` (:mod:`fleetscope.capture.nvml`) and
the NVML fake of the simulator distribution (``fleetscope_sim.nvml_fake``) all read these tables; none of
them defines an NVML number of its own. Names follow ``nvml.h`` (``NVML_ERROR_NOT_SUPPORTED``,
``nvmlClocksEventReasonHwSlowdown``...), values are the header's.
"""

from __future__ import annotations

from dataclasses import dataclass

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


# nvmlEventType* bits
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
EVENT_SINGLE_BIT_ECC_STORM = 0x200
EVENT_DRAM_RETIREMENT = 0x400
EVENT_DRAM_RETIREMENT_FAILURE = 0x800
EVENT_GPU_UNAVAILABLE = 0x4000
EVENT_RECOVERY_ACTION = 0x8000

# nvmlClocksEventReason* bits (the older name: nvmlClocksThrottleReason*), by the reason label fleetscope uses.
THROTTLE_BITS = {
    "gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sync_boost": 0x10,
    "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80, "display_clocks": 0x100,
}
# Throttle-duration fields (ns): reason -> NVML_FI_DEV_CLOCKS_EVENT_REASON_* / PERF_POLICY_* id.
THROTTLE_FIELDS = {"sw_power_cap": 74, "sync_boost": 76, "sw_thermal": 269, "hw_thermal": 270, "hw_power_brake": 271}

# nvmlClockType_t
CLOCK_TYPES = {"graphics": 0, "sm": 1, "memory": 2}

# nvmlGpmMetricId_t: the ratios the GPU collector reads (percent over the interval between two samples).
GPM_METRICS = {2: "sm_active", 3: "sm_occupancy", 5: "tensor_active", 10: "dram_active"}

# nvmlDeviceArchitecture_t (NVML_DEVICE_ARCH_*)
ARCHITECTURES = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
                 9: "hopper", 10: "blackwell"}
ARCHITECTURE_NUMBERS = {name: number for number, name in ARCHITECTURES.items()}
