"""NVIDIA GPUs on the PCI bus, from sysfs, whatever the driver thinks.

A GPU the driver has lost (or never bound) still has its
``/sys/bus/pci/devices/<address>`` entry while it is on the bus, so counting
entries with vendor ``0x10de`` and a display-controller class (``0x0300xx``
VGA, ``0x0302xx`` 3D) beside the NVML count makes "a GPU is missing" visible.
NVSwitches (class ``0x0680xx``) and audio functions are not GPUs.

The sorted PCI addresses also give an index order for Xids the kernel log
reports while NVML is unavailable: NVML enumerates GPUs in PCI bus order.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetscope.sources.fs import Root, Unreadable
from fleetscope.sources.xid import PciAddress

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)


@dataclass(frozen=True)
class PciGpu:
    address: str  # sysfs form, e.g. 0000:53:00.0
    pci: PciAddress
    device_id: int | None


def list_gpus(sysfs: Root) -> list[PciGpu]:
    """NVIDIA GPUs under ``bus/pci/devices``, in PCI address order; unreadable entries are skipped."""
    gpus = []
    for address in sysfs.listdir("bus", "pci", "devices"):
        try:
            vendor = sysfs.read_int("bus", "pci", "devices", address, "vendor", base=16)
            pci_class = sysfs.read_int("bus", "pci", "devices", address, "class", base=16)
        except Unreadable:
            continue
        if vendor != NVIDIA_VENDOR or (pci_class >> 8) not in GPU_CLASSES:
            continue
        try:
            device_id: int | None = sysfs.read_int("bus", "pci", "devices", address, "device", base=16)
        except Unreadable:
            device_id = None
        try:
            gpus.append(PciGpu(address, PciAddress.parse(address), device_id))
        except ValueError:
            continue
    return sorted(gpus, key=lambda g: (g.pci.domain, g.pci.bus, g.pci.device, g.address))
