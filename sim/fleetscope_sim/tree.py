"""Write a node model to disk the way the kernel shows it: a sysfs tree, a procfs tree, a kernel log.

The layout and the atomic, write-when-changed file handling are :mod:`fleetscope_sim.kernel_tree`'s
(the one tree writer, shared with the test fixtures and the benchmarks); this module maps a
:class:`NodeModel` onto it every tick, and writes the two state files that cannot be kernel files
(``gpu.json`` for the NVML fake, ``ena.json`` for the ethtool statistics).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from fleetscope_sim.kernel_tree import (
    NETSTAT_FIELDS,
    SNMP_FIELDS,
    FileTree,
    ProcfsTree,
    SysfsTree,
    kernel_sections,
    kmsg_record,
)
from fleetscope_sim.node import ENA_COUNTERS, NodeModel

EFA_PCI_DEVICE_IDS = {"p4d.24xlarge": "0xefa1", "p5.48xlarge": "0xefa2"}
EFA_FIRMWARE = "0.0.0"


def scratch_base() -> str | None:
    """Where node trees should live: tmpfs when there is one.

    A p5 tree rewrites about 1000 files a tick; renames on a disk-backed
    overlay cost milliseconds each, on tmpfs microseconds.
    """
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def make_workdir(prefix: str) -> str:
    import tempfile

    return tempfile.mkdtemp(prefix=prefix, dir=scratch_base())


@dataclass(frozen=True)
class NodePaths:
    """Where one node's trees live; these become the daemon's --path.* settings."""

    root: str

    @property
    def sysfs(self) -> str:
        return os.path.join(self.root, "sys")

    @property
    def procfs(self) -> str:
        return os.path.join(self.root, "proc")

    @property
    def kmsg(self) -> str:
        return os.path.join(self.root, "kmsg")

    @property
    def gpu_state(self) -> str:
        return os.path.join(self.root, "gpu.json")

    @property
    def ena_stats(self) -> str:
        return os.path.join(self.root, "ena.json")

    @property
    def node_info(self) -> str:
        return os.path.join(self.root, "node.json")

    @property
    def jobs_dir(self) -> str:
        return os.path.join(self.root, "jobs")

    @property
    def nccl_dir(self) -> str:
        """Where the node's rank processes write NCCL Inspector output (the daemon's nccl.dir)."""
        return os.path.join(self.root, "nccl-inspector")


class TreeWriter:
    """Renders one :class:`NodeModel` into its :class:`NodePaths`."""

    def __init__(self, model: NodeModel, paths: NodePaths, now: float | None = None, atomic: bool = True) -> None:
        """``now``: the node's Unix time as it is built (default: the system clock's), which dates its boot;
        ``atomic``: each file replaced by a rename (False: rewritten in place, for a tree read only between
        updates, in the writer's own thread)."""
        self.model = model
        self.paths = paths
        self.sysfs = SysfsTree(paths.sysfs, atomic)
        self.procfs = ProcfsTree(paths.procfs, atomic)
        self.files = FileTree(paths.root, atomic)  # the simulator's own state files
        self._removed: set[str] = set()
        self._kmsg_seq = 1000
        self._boot_wall = (time.time() if now is None else now) - model.uptime

    def setup(self) -> None:
        """Create the node's directories and its expectations; every kernel file comes with :meth:`update`."""
        os.makedirs(self.paths.root, exist_ok=True)
        os.makedirs(self.paths.jobs_dir, exist_ok=True)
        open(self.paths.kmsg, "a").close()
        model = self.model
        # What the node's daemon is configured to expect, as a provisioning tool would set it.
        self.files.write_text(os.path.basename(self.paths.node_info), json.dumps({
            "name": model.name, "instance_type": model.profile.instance_type,
            "gpu_count": model.profile.gpu_count, "efa_count": model.profile.efa_count,
        }))
        self.update()

    @staticmethod
    def _nic_pci_address(index: int) -> str:
        # Where Nitro puts the ENA functions (bus 0, from slot 5), clear of the GPU and EFA functions.
        return f"0000:00:{0x05 + index:02x}.0"

    # -- every tick --------------------------------------------------------------------------

    def update(self) -> None:
        self._write_efa()
        self._write_netdev()
        self._write_procfs()
        self._write_gpu_state()
        self._append_kmsg()

    def _write_efa(self) -> None:
        model = self.model
        rate = model.profile.efa_rate_gbps
        rate_text = {400: "400 Gb/sec (8X HDR)", 200: "200 Gb/sec (4X HDR)"}.get(
            rate, f"{rate} Gb/sec (4X EDR)")
        device_id = EFA_PCI_DEVICE_IDS.get(model.profile.instance_type, "0xefa1")
        for position, efa in enumerate(model.efa):
            if not efa.present:
                # The device vanished: the driver unregistered it, so its class entry and directory go.
                if efa.name not in self._removed:
                    self.sysfs.remove_rdma_device(efa.name, efa.pci_address)
                    self._removed.add(efa.name)
                continue
            self._removed.discard(efa.name)
            self.sysfs.rdma_device(
                efa.name, efa.pci_address, efa.port, efa.device, device_id=device_id,
                numa_node=position * 2 // max(1, len(model.efa)), node_guid=efa.node_guid,
                fw_ver=EFA_FIRMWARE, rate=rate_text,
            )

    def _write_netdev(self) -> None:
        model = self.model
        for index, nic in enumerate(model.nics):
            self.sysfs.net_interface(
                nic.name, nic.stats, operstate="up", carrier_changes=nic.carrier_changes,
                speed=model.profile.ena_speed_mbps, mtu=9001, address=nic.address,
                pci_address=self._nic_pci_address(index), driver="ena",
            )
        self.sysfs.net_interface("lo", {}, operstate="unknown", carrier_changes=0, mtu=65536)

    def _write_procfs(self) -> None:
        model = self.model
        self.procfs.net_dev({"lo": {}, **{nic.name: nic.stats for nic in model.nics}})
        tcp = {"RtoAlgorithm": 1, "RtoMin": 200, "RtoMax": 120000, "MaxConn": -1, "CurrEstab": 48,
               **model.tcp}
        ip = {"Forwarding": 1, "DefaultTTL": 64, "InReceives": model.tcp["InSegs"],
              "InDelivers": model.tcp["InSegs"], "OutRequests": model.tcp["OutSegs"]}
        udp = {"InDatagrams": 1200, "NoPorts": 3, "OutDatagrams": 1180}
        self.procfs.net_snmp(kernel_sections(SNMP_FIELDS, {"Ip": ip, "Tcp": tcp, "Udp": udp}))
        self.procfs.net_netstat(kernel_sections(NETSTAT_FIELDS, {"TcpExt": dict(model.tcp_ext)}))
        self.procfs.uptime(model.uptime)
        self.procfs.stat(self._boot_wall)

    def _write_gpu_state(self) -> None:
        """The GPU half of the node: read by the node process, which feeds its NVML fake."""
        model = self.model
        gpu_model = model.profile.gpu
        state = {
            "name": gpu_model.name,
            "memory_total_bytes": gpu_model.memory_bytes,
            "sm_clock_max_mhz": gpu_model.sm_clock_max_mhz,
            "mem_clock_max_mhz": gpu_model.mem_clock_max_mhz,
            "power_limit_w": gpu_model.power_limit_w,
            "slowdown_temp_c": gpu_model.slowdown_temp_c,
            "shutdown_temp_c": gpu_model.shutdown_temp_c,
            "architecture": gpu_model.architecture,
            "gpus": [
                {
                    "index": g.index, "uuid": g.uuid, "serial": g.serial, "bus_id": g.bus_id,
                    "utilization": round(g.utilization, 4), "memory_utilization": round(g.memory_utilization, 4),
                    "memory_used_bytes": g.memory_used_bytes, "temperature_c": round(g.temperature_c, 1),
                    "memory_temperature_c": round(g.memory_temperature_c, 1), "power_w": round(g.power_w, 1),
                    "energy_j": round(g.energy_j, 3), "sm_clock_mhz": g.sm_clock_mhz, "mem_clock_mhz": g.mem_clock_mhz,
                    "throttle": sorted(g.throttle),
                    "throttle_seconds": {k: round(v, 3) for k, v in g.throttle_seconds.items()},
                    "ecc_corrected": g.ecc_corrected, "ecc_uncorrected": g.ecc_uncorrected,
                    "remapped_correctable": g.remapped_correctable, "remapped_uncorrectable": g.remapped_uncorrectable,
                    "remap_pending": g.remap_pending, "remap_failed": g.remap_failed,
                    "pcie_replays": g.pcie_replays, "lost": g.lost, "xids": list(g.xids),
                }
                for g in model.gpus
            ],
        }
        self.files.write_text(os.path.basename(self.paths.gpu_state), json.dumps(state, sort_keys=True))
        ena = {nic.name: {name: nic.ena[name] for name in ENA_COUNTERS} for nic in model.nics}
        self.files.write_text(os.path.basename(self.paths.ena_stats), json.dumps(ena, sort_keys=True))

    def _append_kmsg(self) -> None:
        lines = self.model.drain_kmsg()
        if not lines:
            return
        records = []
        for line in lines:
            self._kmsg_seq += 1
            records.append(kmsg_record(3, self._kmsg_seq, int(self.model.uptime * 1e6), line))
        self.files.append_text(os.path.basename(self.paths.kmsg), "".join(records))
