"""Scenario files for the NVML fake, and a matching sysfs PCI tree.

A scenario is YAML::

    description: 8x H100 SXM, healthy
    base: other_scenario          # optional: start from another scenario, then override
    driver_version: "550.90.07"
    nvml_version: "12.550.90.07"
    missing_functions: []         # symbols the simulated (older) driver lacks
    max_field_id: 400             # field ids above this answer NOT_SUPPORTED
    pci_buses: [0x53, 0x64, ...]  # one GPU per bus, index order
    defaults: {FakeGpu field: value, ...}
    gpus: {3: {field: value}}     # per-GPU overrides
    lost: [3]                     # GPUs already fallen off the bus
    hang: [nvmlDeviceGetPowerUsage]
    pending_events: [{gpu: 2, xid: 79}]   # delivered once the GPU is registered for events
    init_error: NVML_ERROR_DRIVER_NOT_LOADED   # nvmlInit fails (no GPU use at all)
    latency: h100_sxm_580         # what each call costs (latency/<name>.yaml, or the model inline):
                                  # booked on a virtual clock, see fleetscope_sim.nvml_fake.latency

``null`` for a value means the driver answers NOT_SUPPORTED for it; a return-code name from nvml.h
(``NVML_ERROR_NO_PERMISSION``) in a value's place means it answers that code. ``errors`` (in
``defaults`` or per GPU) gives an entry point (its C symbol) or a field (``field:<id>``) a code of
its own whatever the value: ``errors: {nvmlDeviceGetEnforcedPowerLimit: NVML_ERROR_NOT_SUPPORTED}``.
``fleetscope capture`` writes the same format from a real node (every value and code it answered).
"""

from __future__ import annotations

import os
from typing import Any

from fleetscope.sources.nvml_h import EVENT_XID, NvmlReturn
from fleetscope_sim.nvml_fake.latency import LatencyModel
from fleetscope_sim.nvml_fake.library import FakeGpu, FakeNvml

SCENARIO_DIR = os.path.dirname(os.path.abspath(__file__))


def scenario_names() -> list[str]:
    return sorted(name[:-5] for name in os.listdir(SCENARIO_DIR) if name.endswith(".yaml"))


def read_scenario(path_or_name: str) -> dict[str, Any]:
    """A scenario's data as written, its ``base`` merged in (plain YAML values, no fake built)."""
    return _read(path_or_name)


def _read(path_or_name: str) -> dict[str, Any]:
    import yaml  # lazy: only the fake needs it here

    path = path_or_name
    if os.path.sep not in path_or_name and not path_or_name.endswith(".yaml"):
        path = os.path.join(SCENARIO_DIR, path_or_name + ".yaml")
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    base = data.pop("base", None)
    if base is None:
        return data
    if os.path.sep not in base:  # a name: beside this scenario, else a shipped one
        beside = os.path.join(os.path.dirname(path), base + ".yaml")
        base = beside if os.path.isfile(beside) else base
    merged = _read(base)
    for key, value in data.items():
        merged[key] = _merge(merged.get(key), value)
    return merged


def _merge(base: Any, override: Any) -> Any:
    """Dicts merge key by key (recursively); anything else replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in override.items()}}
    return override


def load_scenario(path_or_name: str) -> FakeNvml:
    """A fresh :class:`FakeNvml` from a scenario file (a path, or a name in this directory)."""
    data = _read(path_or_name)
    defaults = dict(data.get("defaults") or {})
    overrides = {int(k): v for k, v in (data.get("gpus") or {}).items()}
    gpus = []
    for index, bus in enumerate(data.get("pci_buses") or []):
        fields = _merge(defaults, overrides.get(index, {}))
        device = fields.pop("pci_device", 0)
        if "nvlink_up" in fields and isinstance(fields["nvlink_up"], int):
            fields["nvlink_up"] = [True] * fields["nvlink_up"]
        gpus.append(FakeGpu(index=index, pci_bus=int(bus), pci_device=int(device), **_copy(_statuses(fields))))
    fake = FakeNvml(
        gpus,
        driver_version=str(data.get("driver_version", "550.90.07")),
        nvml_version=str(data.get("nvml_version", "12.550.90.07")),
        cuda_driver_version=int(data.get("cuda_driver_version", 12040)),
        missing_functions=tuple(data.get("missing_functions") or ()),
        max_field_id=int(data.get("max_field_id", 400)),
        name=str(data.get("description", os.path.basename(path_or_name))),
        init_error=NvmlReturn.named(data["init_error"]) if data.get("init_error") else None,
        latency=LatencyModel.of(data["latency"]) if data.get("latency") else None,
    )
    for index in data.get("lost") or ():
        fake.lose(int(index))
    for function in data.get("hang") or ():
        fake.hang(str(function))
    for event in data.get("pending_events") or ():
        fake.pending_events.append((int(event["gpu"]), int(event.get("type", EVENT_XID)), int(event.get("xid", 0))))
    return fake


def _statuses(value: Any) -> Any:
    """Return-code names (``NVML_ERROR_...``) in a value's place, anywhere in the fields, as :class:`NvmlReturn`."""
    if isinstance(value, str) and value.startswith("NVML_ERROR_"):
        return NvmlReturn.named(value)
    if isinstance(value, dict):
        return {k: _statuses(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_statuses(v) for v in value]
    return value


def _copy(fields: dict[str, Any]) -> dict[str, Any]:
    """Per-GPU copies, so changing one GPU's dict or list never changes another's."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, dict):
            out[key] = {k: (list(v) if isinstance(v, list) else v) for k, v in value.items()}
        elif isinstance(value, (list, set)):
            out[key] = type(value)(value)
        else:
            out[key] = value
    return out


def write_sysfs(fake: FakeNvml, sysfs_root: str, present: list[int] | None = None) -> None:
    """The PCI functions of the fake's GPUs (vendor, device, class) in a sysfs tree, and two that are not GPUs.

    ``present`` limits which GPUs are on the bus (a GPU that vanished from PCI entirely).
    """
    from fleetscope_sim.kernel_tree import SysfsTree

    sysfs = SysfsTree(sysfs_root)
    for gpu in fake.gpus:
        if present is not None and gpu.index not in present:
            continue
        sysfs.pci_function(gpu.sysfs_address, vendor="0x10de", device_id=f"0x{gpu.pci_device_id >> 16:04x}",
                           driver="nvidia", pci_class="0x030200")
    # An NVSwitch bridge (class 0x0680) and an ENA NIC: on the bus, not GPUs.
    sysfs.pci_function("0000:07:00.0", vendor="0x10de", device_id="0x22a3", driver="nvidia",
                       pci_class="0x068000")
    sysfs.pci_function("0000:00:05.0", vendor="0x1d0f", device_id="0xec20", driver="ena")
