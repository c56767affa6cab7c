"""The NVIDIA Xid catalog (immediate-action classes) and the Xid ledger.

Facts: NVIDIA's Xid catalog for Ampere and newer gives each code an
"immediate action" bucket (docs.nvidia.com/deploy/xid-errors, as carried in
NVIDIA/NVSentinel's ``xiderrorsmapping.csv``); the RESTART_APP list is the
one the ECS agent derives from the same catalog. Codes the catalog does not
list get ``UNKNOWN``.

The ledger turns Xid sightings from two sources (NVML events, the kernel log)
into one true counter: a sighting joins an earlier *incident* of the same GPU
and Xid when it comes from a source that has not yet reported that incident
and lies within ``window`` seconds of it; otherwise it is a new occurrence.
Repeats from the same source always count (two identical Xids are two errors).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

# code -> (mnemonic, immediate action)
XID_CATALOG: dict[int, tuple[str, str]] = {
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP"),
    31: ("FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
    43: ("RESETCHANNEL_VERIF_ERROR", "IGNORE"),
    45: ("PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45"),
    46: ("GPU_TIMEOUT_ERROR", "RESET_GPU"),
    48: ("GPU_ECC_DBE", "WORKFLOW_XID_48"),
    54: ("SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS"),
    61: ("PMU_BREAKPOINT", "CONTACT_SUPPORT"),
    62: ("PMU_HALT_ERROR", "RESET_GPU"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU"),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
    79: ("GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "IGNORE"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
    109: ("CTXSW_TIMEOUT_ERROR", "RESET_GPU"),
    110: ("SEC_FAULT_ERROR", "RESET_GPU"),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU"),
    120: ("GSP_ERROR", "RESET_GPU"),
    121: ("C2C_ERROR", "IGNORE"),
    136: ("ALI_TRAINING_FAIL", "RESET_GPU"),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU"),
    143: ("GPU_INIT_ERROR", "RESET_GPU"),
    144: ("NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    145: ("NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    146: ("NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    147: ("NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR"),
    148: ("NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR"),
    149: ("NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR"),
    150: ("NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR"),
    151: ("KEY_ROTATION_ERROR", "RESTART_VM"),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "FOLLOW_RECOVERY_ACTION"),
    155: ("NVLINK_SW_DEFINED_ERROR", "RESET_GPU"),
    156: ("RESOURCE_RETIREMENT_EVENT", "RESET_GPU"),
    157: ("RESOURCE_RETIREMENT_FAILURE", "IGNORE"),
    158: ("GPU_FATAL_TIMEOUT", "RESET_GPU"),
    159: ("CHI_NON_DATA_ERROR", "CHECK_UVM"),
    160: ("CHANNEL_RETIREMENT_EVENT", "RESTART_BM"),
}
# The remaining codes of the catalog's RESTART_APP bucket (application-level faults).
for _code in (8, 11, 25, 32, 39, 40, 41, 60, 68, 69, 70, 71, 72, 75, 76, 77, 80, 82, 83, 84, 85, 86, 88, 89,
              96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 126, 127, 128, 129, 130, 131, 132, 133, 134, 135, 139):
    XID_CATALOG.setdefault(_code, ("", "RESTART_APP"))
del _code

# Actions that leave the GPU or node needing an operator (or a reset) before it can be trusted again.
NODE_ACTIONS = frozenset({
    "RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR",
    "CHECK_MECHANICALS", "CONTACT_SUPPORT", "UPDATE_SWFW",
})
UNKNOWN_XID = 999  # NVML's eventData for "unknown Xid"
# Codes the catalog does not list share one key (label "unknown"), so a stream of odd codes cannot
# grow the series without bound (#35 item 6).
UNKNOWN_CODE = -1


def bounded_code(xid: int) -> int:
    """The code as the ledger keys it: a catalog code, or :data:`UNKNOWN_CODE`."""
    return xid if xid in XID_CATALOG else UNKNOWN_CODE


def xid_label(xid: int) -> str:
    return "unknown" if xid == UNKNOWN_CODE else str(xid)


def xid_action(xid: int) -> str:
    return XID_CATALOG.get(xid, ("", "UNKNOWN"))[1]


def is_fatal(xid: int) -> bool:
    return xid_action(xid) in NODE_ACTIONS


@dataclass(frozen=True)
class PciAddress:
    """A GPU's PCI location; the kernel log omits the function, so it is not part of the key."""

    domain: int
    bus: int
    device: int

    @classmethod
    def parse(cls, text: str) -> PciAddress:
        """``00000000:53:00.0`` (NVML), ``0000:53:00`` (Xid line), ``0000:53:00.0`` (sysfs) or ``53:00``."""
        parts = text.strip().split(".")[0].split(":")
        if len(parts) == 2:
            parts = ["0", *parts]
        if len(parts) != 3:
            raise ValueError(f"not a PCI address: {text!r}")
        return cls(int(parts[0], 16), int(parts[1], 16), int(parts[2], 16))

    def __str__(self) -> str:
        if self.domain < 0:
            return "other"
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}"


# Every kernel-log Xid naming an address that is none of the node's GPUs: one key for all of them.
OTHER_GPU = PciAddress(-1, 0, 0)


@dataclass(frozen=True)
class XidSighting:
    """One Xid as one source saw it."""

    pci: PciAddress
    xid: int
    timestamp: float  # Unix seconds
    source: str  # "nvml" or "kmsg"
    detail: str = ""


@dataclass
class _Incident:
    timestamp: float
    sources: set[str] = field(default_factory=set)


class XidLedger:
    """Thread-safe true counters of Xid occurrences per (GPU, Xid)."""

    def __init__(self, window: float = 10.0, history: int = 256) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._counts: dict[tuple[PciAddress, int], int] = {}
        self._last: dict[PciAddress, float] = {}
        self._recent: dict[tuple[PciAddress, int], deque[_Incident]] = {}
        self._history = history
        self._counted: deque[XidSighting] = deque(maxlen=history)

    def record(self, sighting: XidSighting) -> bool:
        """Add a sighting; True if it is a new occurrence (False: another source already counted it).

        Codes outside the catalog are counted under :data:`UNKNOWN_CODE`.
        """
        code = bounded_code(sighting.xid)
        if code != sighting.xid:
            sighting = XidSighting(sighting.pci, code, sighting.timestamp, sighting.source, sighting.detail)
        key = (sighting.pci, sighting.xid)
        with self._lock:
            incidents = self._recent.setdefault(key, deque(maxlen=self._history))
            for incident in incidents:
                close = abs(incident.timestamp - sighting.timestamp) <= self.window
                if close and sighting.source not in incident.sources:
                    incident.sources.add(sighting.source)
                    return False
            incidents.append(_Incident(sighting.timestamp, {sighting.source}))
            self._counts[key] = self._counts.get(key, 0) + 1
            self._last[sighting.pci] = max(self._last.get(sighting.pci, 0.0), sighting.timestamp)
            self._counted.append(sighting)
            return True

    def counts(self) -> dict[tuple[PciAddress, int], int]:
        with self._lock:
            return dict(self._counts)

    def last_timestamps(self) -> dict[PciAddress, float]:
        with self._lock:
            return dict(self._last)

    def since(self, cutoff: float) -> list[XidSighting]:
        """Counted occurrences at or after ``cutoff`` (the most recent ``history`` of them)."""
        with self._lock:
            return [s for s in self._counted if s.timestamp >= cutoff]
