"""Write a node model to disk the way the kernel shows it: a sysfs tree, a procfs tree, a kernel log.

Every file is replaced atomically (write a temporary file, rename): a reader
racing with a tick sees the old or the new value, never a torn number that
would look like a counter reset. Unchanged files are not rewritten.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass

from fleetscope.sim.node import ENA_COUNTERS, NodeModel

EFA_PCI_DEVICE_IDS = {"p4d.24xlarge": "0xefa1", "p5.48xlarge": "0xefa2"}


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


class TreeWriter:
    """Renders one :class:`NodeModel` into its :class:`NodePaths`."""

    def __init__(self, model: NodeModel, paths: NodePaths) -> None:
        self.model = model
        self.paths = paths
        self._written: dict[str, str] = {}
        self._removed: set[str] = set()
        self._kmsg_seq = 1000
        self._boot_wall = time.time() - model.uptime

    # -- helpers -----------------------------------------------------------------------------

    def _write(self, path: str, text: str) -> None:
        if self._written.get(path) == text:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as handle:
            handle.write(text)
        os.replace(tmp, path)
        self._written[path] = text

    def _sys(self, *parts: str) -> str:
        return os.path.join(self.paths.sysfs, *parts)

    def _symlink(self, link: str, target: str) -> None:
        if os.path.islink(link):
            return
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(target, os.path.dirname(link)), link)

    def _device_link(self, child_dir: str, pci: str) -> None:
        """``<dev>/device`` the way the kernel writes it: up to the bus, then down by the PCI address."""
        link = os.path.join(child_dir, "device")
        if not os.path.islink(link):
            os.makedirs(child_dir, exist_ok=True)
            os.symlink(os.path.join("..", "..", "..", os.path.basename(pci)), link)

    # -- static layout -----------------------------------------------------------------------

    def setup(self) -> None:
        """Create the parts that never change (identity files, links); counters come with :meth:`update`."""
        os.makedirs(self.paths.root, exist_ok=True)
        os.makedirs(self.paths.jobs_dir, exist_ok=True)
        open(self.paths.kmsg, "a").close()
        model = self.model
        # What the node's daemon is configured to expect, as a provisioning tool would set it.
        self._write(self.paths.node_info, json.dumps({
            "name": model.name, "instance_type": model.profile.instance_type,
            "gpu_count": model.profile.gpu_count, "efa_count": model.profile.efa_count,
        }))
        device_id = EFA_PCI_DEVICE_IDS.get(model.profile.instance_type, "0xefa1")
        drivers = self._sys("bus", "pci", "drivers")
        for numa, efa in enumerate(model.efa):
            pci = self._pci_dir(efa.pci_address)
            self._write(os.path.join(pci, "vendor"), "0x1d0f\n")
            self._write(os.path.join(pci, "device"), f"{device_id}\n")
            self._write(os.path.join(pci, "numa_node"), f"{numa * 2 // max(1, len(model.efa))}\n")
            self._symlink(os.path.join(pci, "driver"), os.path.join(drivers, "efa"))
        for i, nic in enumerate(model.nics):
            pci = self._pci_dir(f"0000:{0x20 + i:02x}:00.0")
            self._write(os.path.join(pci, "vendor"), "0x1d0f\n")
            self._write(os.path.join(pci, "device"), "0xec20\n")
            self._symlink(os.path.join(pci, "driver"), os.path.join(drivers, "ena"))
            netdir = os.path.join(pci, "net", nic.name)
            self._symlink(self._sys("class", "net", nic.name), netdir)
            self._device_link(netdir, pci)
            for name, value in (("operstate", "up"), ("address", nic.address), ("mtu", "9001"),
                                ("speed", str(model.profile.ena_speed_mbps)), ("carrier", "1"), ("type", "1")):
                self._write(os.path.join(netdir, name), f"{value}\n")
        lo = self._sys("devices", "virtual", "net", "lo")
        self._symlink(self._sys("class", "net", "lo"), lo)
        for name, value in (("operstate", "unknown"), ("address", "00:00:00:00:00:00"), ("mtu", "65536"),
                            ("carrier", "1"), ("type", "772")):
            self._write(os.path.join(lo, name), f"{value}\n")
        for counter in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets"):
            self._write(os.path.join(lo, "statistics", counter), "0\n")
        self.update()

    def _pci_dir(self, address: str) -> str:
        return self._sys("devices", "pci0000:00", address)

    # -- every tick --------------------------------------------------------------------------

    def update(self) -> None:
        self._write_efa()
        self._write_netdev()
        self._write_procfs()
        self._write_gpu_state()
        self._append_kmsg()

    def _write_efa(self) -> None:
        rate = self.model.profile.efa_rate_gbps
        rate_text = {400: "400 Gb/sec (8X HDR)", 200: "200 Gb/sec (4X HDR)"}.get(rate, f"{rate} Gb/sec (4X EDR)")
        for efa in self.model.efa:
            pci = self._pci_dir(efa.pci_address)
            devdir = os.path.join(pci, "infiniband", efa.name)
            link = self._sys("class", "infiniband", efa.name)
            if not efa.present:
                # The device vanished: the driver unregistered it, so its class entry and directory go.
                if efa.name not in self._removed:
                    if os.path.islink(link):
                        os.unlink(link)
                    shutil.rmtree(devdir, ignore_errors=True)
                    self._written = {p: t for p, t in self._written.items() if not p.startswith(devdir + os.sep)}
                    self._removed.add(efa.name)
                continue
            self._removed.discard(efa.name)
            self._write(os.path.join(devdir, "node_guid"), f"{efa.node_guid}\n")
            self._write(os.path.join(devdir, "fw_ver"), "0.0.0\n")
            self._write(os.path.join(devdir, "node_type"), "1: CA\n")
            self._write(os.path.join(devdir, "hw_counters", "lifespan"), "12\n")
            for name, value in efa.device.items():
                self._write(os.path.join(devdir, "hw_counters", name), f"{value}\n")
            port = os.path.join(devdir, "ports", "1")
            self._write(os.path.join(port, "state"), "4: ACTIVE\n")
            self._write(os.path.join(port, "phys_state"), "5: LinkUp\n")
            self._write(os.path.join(port, "rate"), f"{rate_text}\n")
            self._write(os.path.join(port, "link_layer"), "Unknown\n")
            self._write(os.path.join(port, "hw_counters", "lifespan"), "12\n")
            for name, value in efa.port.items():
                self._write(os.path.join(port, "hw_counters", name), f"{value}\n")
            self._device_link(devdir, pci)
            self._symlink(link, devdir)

    def _write_netdev(self) -> None:
        for nic in self.model.nics:
            netdir = os.path.realpath(self._sys("class", "net", nic.name))
            for name, value in nic.stats.items():
                self._write(os.path.join(netdir, "statistics", name), f"{value}\n")
            self._write(os.path.join(netdir, "carrier_changes"), f"{nic.carrier_changes}\n")

    def _write_procfs(self) -> None:
        model = self.model
        proc = self.paths.procfs
        lines = ["Inter-|   Receive                                                |  Transmit",
                 (" face |bytes    packets errs drop fifo frame compressed multicast|"
                  "bytes    packets errs drop fifo colls carrier compressed")]
        lines.append(f"    lo: {'0 ' * 16}".rstrip())
        for nic in model.nics:
            s = nic.stats
            rx = [s["rx_bytes"], s["rx_packets"], s["rx_errors"], s["rx_dropped"] + s["rx_missed_errors"], 0, 0, 0, 0]
            tx = [s["tx_bytes"], s["tx_packets"], s["tx_errors"], s["tx_dropped"], 0, 0, 0, 0]
            lines.append(f"{nic.name:>6}: " + " ".join(str(v) for v in rx + tx))
        self._write(os.path.join(proc, "net", "dev"), "\n".join(lines) + "\n")
        tcp_names = ["RtoAlgorithm", "RtoMin", "RtoMax", "MaxConn", *model.tcp, "CurrEstab"]
        tcp_values = [1, 200, 120000, -1, *model.tcp.values(), 48]
        snmp = (
            "Ip: Forwarding DefaultTTL InReceives InDelivers OutRequests\n"
            f"Ip: 1 64 {model.tcp['InSegs']} {model.tcp['InSegs']} {model.tcp['OutSegs']}\n"
            f"Tcp: {' '.join(tcp_names)}\n"
            f"Tcp: {' '.join(str(v) for v in tcp_values)}\n"
            "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n"
            "Udp: 1200 3 0 1180 0 0\n"
        )
        self._write(os.path.join(proc, "net", "snmp"), snmp)
        netstat = (
            f"TcpExt: SyncookiesSent {' '.join(model.tcp_ext)}\n"
            f"TcpExt: 0 {' '.join(str(v) for v in model.tcp_ext.values())}\n"
            "IpExt: InNoRoutes InCsumErrors\n"
            "IpExt: 0 0\n"
        )
        self._write(os.path.join(proc, "net", "netstat"), netstat)
        self._write(os.path.join(proc, "uptime"), f"{model.uptime:.2f} {model.uptime * 150:.2f}\n")
        # Boot time, so kernel-log stamps (microseconds since boot) map to wall-clock time.
        self._write(os.path.join(proc, "stat"), f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {int(self._boot_wall)}\n")

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
        self._write(self.paths.gpu_state, json.dumps(state, indent=None, sort_keys=True))
        ena = {nic.name: {name: nic.ena[name] for name in ENA_COUNTERS} for nic in model.nics}
        self._write(self.paths.ena_stats, json.dumps(ena, sort_keys=True))

    def _append_kmsg(self) -> None:
        lines = self.model.drain_kmsg()
        if not lines:
            return
        with open(self.paths.kmsg, "a", encoding="utf-8") as handle:
            for line in lines:
                # /dev/kmsg record format: priority,sequence,microseconds,flags;message
                self._kmsg_seq += 1
                handle.write(f"3,{self._kmsg_seq},{int(self.model.uptime * 1e6)},-;{line}\n")
