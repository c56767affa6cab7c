"""nvml.h's facts in one module: every number as the binding (which mirrors the header) has it, and
no other module of the product or the simulator spells a field id of its own."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pynvml  # type: ignore[import-untyped]

from fleetscope.sources import nvml_h
from fleetscope.sources.nvml import NvmlValue

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "exporter" / "fleetscope", ROOT / "sim" / "fleetscope_sim")
NVML_H = ROOT / "exporter" / "fleetscope" / "sources" / "nvml_h.py"

# The label fleetscope gives each bit -> its name in nvml.h.
THROTTLE_NAMES = {
    "gpu_idle": "nvmlClocksEventReasonGpuIdle", "applications_clocks": "nvmlClocksEventReasonApplicationsClocksSetting",
    "sw_power_cap": "nvmlClocksEventReasonSwPowerCap", "hw_slowdown": "nvmlClocksEventReasonHwSlowdown",
    "sync_boost": "nvmlClocksEventReasonSyncBoost", "sw_thermal": "nvmlClocksEventReasonSwThermalSlowdown",
    "hw_thermal": "nvmlClocksEventReasonHwThermalSlowdown",
    "hw_power_brake": "nvmlClocksEventReasonHwPowerBrakeSlowdown",
    "display_clocks": "nvmlClocksEventReasonDisplayClockSetting",
}
EVENT_NAMES = {
    "EVENT_SINGLE_BIT_ECC": "nvmlEventTypeSingleBitEccError", "EVENT_DOUBLE_BIT_ECC": "nvmlEventTypeDoubleBitEccError",
    "EVENT_XID": "nvmlEventTypeXidCriticalError", "EVENT_SINGLE_BIT_ECC_STORM": "nvmlEventTypeSingleBitEccErrorStorm",
    "EVENT_DRAM_RETIREMENT": "nvmlEventTypeDramRetirementEvent",
    "EVENT_DRAM_RETIREMENT_FAILURE": "nvmlEventTypeDramRetirementFailure",
    "EVENT_GPU_UNAVAILABLE": "nvmlEventTypeGpuUnavailableError",
    "EVENT_RECOVERY_ACTION": "nvmlEventTypeGpuRecoveryAction",
}
GPM_NAMES = {"sm_active": "NVML_GPM_METRIC_SM_UTIL", "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
             "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL", "dram_active": "NVML_GPM_METRIC_DRAM_BW_UTIL"}
CLOCK_NAMES = {"graphics": "NVML_CLOCK_GRAPHICS", "sm": "NVML_CLOCK_SM", "memory": "NVML_CLOCK_MEM"}


def test_every_number_is_the_headers() -> None:
    for name, value in vars(nvml_h).items():
        if name.startswith(("ERROR_", "FI_DEV_")) or name == "SUCCESS":
            assert getattr(pynvml, "NVML_" + name) == value, name
    for code, (name, _) in nvml_h.RETURN_CODES.items():
        assert getattr(pynvml, name) == code, name
    assert {reason: getattr(pynvml, THROTTLE_NAMES[reason]) for reason in nvml_h.THROTTLE_BITS} == nvml_h.THROTTLE_BITS
    for name, c_name in EVENT_NAMES.items():
        assert getattr(nvml_h, name) == getattr(pynvml, c_name), name
    assert {getattr(pynvml, GPM_NAMES[value]): value for value in nvml_h.GPM_METRICS.values()} == nvml_h.GPM_METRICS
    assert {clock: getattr(pynvml, CLOCK_NAMES[clock]) for clock in nvml_h.CLOCK_TYPES} == nvml_h.CLOCK_TYPES
    for number, name in nvml_h.ARCHITECTURES.items():
        assert getattr(pynvml, f"NVML_DEVICE_ARCH_{name.upper()}") == number
    assert {getattr(pynvml, f"NVML_GPM_METRIC_NVLINK_TOTAL_{d.upper()}_PER_SEC"): d
            for d in ("rx", "tx")} == nvml_h.GPM_NVLINK_TOTAL
    for link in range(nvml_h.GPM_NVLINK_MAX_LINKS):
        assert nvml_h.gpm_nvlink_link_metrics(link) == {
            getattr(pynvml, f"NVML_GPM_METRIC_NVLINK_L{link}_{d.upper()}_PER_SEC"): d for d in ("rx", "tx")}
    for number, name in nvml_h.FABRIC_STATES.items():
        assert getattr(pynvml, f"NVML_GPU_FABRIC_STATE_{name.upper()}") == number
    assert (pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3) == (nvml_h.FABRIC_INFO_V2, nvml_h.FABRIC_INFO_V3)
    assert nvml_h.SCOPE_ALL_LINKS == 2**32 - 1 and nvml_h.NO_INSTANCE == 2**32 - 1  # UINT_MAX


def test_the_field_table_names_header_ids_and_reading_values() -> None:
    defined = {value for name, value in vars(nvml_h).items() if name.startswith("FI_DEV_")}
    ids = [field.id for field in nvml_h.FIELDS]
    assert len(ids) == len(set(ids)) and set(ids) == defined  # each id once, none left unread
    values = set(get_args(NvmlValue))
    for field in nvml_h.FIELDS:
        assert field.value is None or field.value in values, field
        assert field.home[0], field
    assert {f.value for f in nvml_h.FIELDS if f.value is None} == {None} and len(nvml_h.LINK_FIELDS) == 6


def _id_literals(path: Path, ids: set[int]) -> list[str]:
    """Where a module uses a field id as a number: a dict key, a tuple member or a comparison."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        candidates: list[ast.expr | None] = []
        if isinstance(node, ast.Dict):
            candidates = list(node.keys)
        elif isinstance(node, ast.Tuple):
            candidates = list(node.elts)
        elif isinstance(node, ast.Compare):
            candidates = [node.left, *node.comparators]
        found.extend(f"{path.relative_to(ROOT)}:{candidate.lineno}: {candidate.value}" for candidate in candidates
                     if isinstance(candidate, ast.Constant) and type(candidate.value) is int and candidate.value in ids)
    return found


def _speaks_nvml(path: Path) -> bool:
    """A module that talks to NVML (the binding, the header module, the fake): where a field id would be a
    field id. Elsewhere the same numbers are Xid codes and the like."""
    text = path.read_text()
    return any(marker in text for marker in ("nvml_h", "import pynvml", "nvml_fake"))


def test_no_other_module_spells_a_field_id() -> None:
    # Ids 3-6 are also nvmlValueType_t's numbers (which member of a field value's union holds it),
    # which the fake and the readers do spell; every other id is a field id only.
    ids = {field.id for field in nvml_h.FIELDS if field.id > 6}
    modules = [path for package in PACKAGES for path in sorted(package.rglob("*.py"))
               if path != NVML_H and _speaks_nvml(path)]
    assert {path.name for path in modules} >= {"nvml.py", "library.py", "gpufeed.py"}  # reader, capture, fake
    assert [hit for path in modules for hit in _id_literals(path, ids)] == []
    # nvml_h.py itself names each id once, as a constant, and the table uses the constants
    table = next(node for node in ast.parse(NVML_H.read_text()).body
                 if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "FIELDS")
    rows = [node for node in ast.walk(table) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Field"]
    assert len(rows) == len(nvml_h.FIELDS) and all(isinstance(row.args[0], ast.Name) for row in rows)
