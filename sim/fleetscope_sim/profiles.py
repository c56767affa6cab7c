"""Instance profiles: what a simulated node has (counts and names follow real P4d/P5 nodes)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_bytes: int
    sm_clock_max_mhz: int
    mem_clock_max_mhz: int
    power_limit_w: float
    idle_power_w: float
    busy_power_w: float
    slowdown_temp_c: int
    shutdown_temp_c: int
    architecture: str
    pci_device_id: str


H100_SXM = GpuModel(
    "NVIDIA H100 80GB HBM3", 80 * 1024**3, 1980, 2619, 700.0, 70.0, 620.0, 87, 92, "hopper", "2330",
)
A100_SXM = GpuModel(
    "NVIDIA A100-SXM4-40GB", 40 * 1024**3, 1410, 1215, 400.0, 55.0, 350.0, 88, 92, "ampere", "20b0",
)


@dataclass(frozen=True)
class NodeProfile:
    """One instance type: GPUs, EFA devices (PCI-derived names) and ENA interfaces."""

    instance_type: str
    gpu: GpuModel
    gpu_count: int
    gpu_bus_ids: tuple[int, ...]
    efa_devices: tuple[str, ...]
    efa_rate_gbps: int
    ena_interfaces: tuple[str, ...]
    ena_speed_mbps: int

    @property
    def efa_count(self) -> int:
        return len(self.efa_devices)


def _rdma_name(bus: int, slot: int) -> str:
    # rdma_rename's PCI naming prints bus and slot in decimal: rdmap<bus>s<slot>.
    return f"rdmap{bus}s{slot}"


# The 32 device names observed on p5.48xlarge: 8 groups of 4 consecutive buses.
_P5_EFA_BUSES = tuple(b + i for b in (79, 96, 113, 130, 147, 164, 181, 198) for i in range(4))

P5 = NodeProfile(
    instance_type="p5.48xlarge",
    gpu=H100_SXM,
    gpu_count=8,
    gpu_bus_ids=(0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA),
    efa_devices=tuple(_rdma_name(bus, 0) for bus in _P5_EFA_BUSES),
    efa_rate_gbps=100,
    ena_interfaces=("ens32",),
    ena_speed_mbps=100_000,
)

P4D = NodeProfile(
    instance_type="p4d.24xlarge",
    gpu=A100_SXM,
    gpu_count=8,
    gpu_bus_ids=(0x10, 0x20, 0x30, 0x40, 0x90, 0xA0, 0xB0, 0xC0),
    efa_devices=("rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"),
    efa_rate_gbps=100,
    ena_interfaces=("ens32",),
    ena_speed_mbps=100_000,
)

PROFILES: dict[str, NodeProfile] = {p.instance_type: p for p in (P5, P4D)}
SHORT_NAMES: dict[str, str] = {"p5": P5.instance_type, "p4d": P4D.instance_type}


def profile(name: str) -> NodeProfile:
    """Look a profile up by instance type or short name (``p5``, ``p4d``)."""
    key = SHORT_NAMES.get(name, name)
    try:
        return PROFILES[key]
    except KeyError:
        raise ValueError(f"unknown instance profile {name!r} (known: {', '.join(PROFILES)})") from None
