"""One simulated node: GPU, EFA, NIC/ENA and TCP state that moves every tick.

The model is deliberately simple but keeps the shapes real: counters only
grow (unless a device vanishes), traffic follows the training load on the
node, GPU clocks, power and temperature follow utilisation, and faults
change exactly the values the real failure would change.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from fleetscope_sim.faults import Fault
from fleetscope_sim.profiles import NodeProfile

EFA_PORT_COUNTERS = (
    "tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops",
    "send_bytes", "send_wrs", "recv_bytes", "recv_wrs",
    "rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes",
    "rdma_write_wrs", "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes",
    "retrans_bytes", "retrans_pkts", "retrans_timeout_events", "unresponsive_remote_events",
    "impaired_remote_conn_events",
)
EFA_DEVICE_COUNTERS = (
    "submitted_cmds", "completed_cmds", "cmds_err", "no_completion_cmds", "keep_alive_rcvd",
    "alloc_pd_err", "create_qp_err", "create_cq_err", "reg_mr_err", "alloc_ucontext_err", "create_ah_err", "mmap_err",
)
NETDEV_COUNTERS = (
    "rx_bytes", "rx_packets", "rx_errors", "rx_dropped", "rx_missed_errors",
    "tx_bytes", "tx_packets", "tx_errors", "tx_dropped",
)
ENA_COUNTERS = (
    "total_resets", "reset_fail", "tx_timeout", "wd_expired", "interface_up", "interface_down",
    "bw_in_allowance_exceeded", "bw_out_allowance_exceeded", "pps_allowance_exceeded",
    "conntrack_allowance_exceeded", "linklocal_allowance_exceeded", "conntrack_allowance_available",
)
TCP_COUNTERS = ("ActiveOpens", "PassiveOpens", "AttemptFails", "EstabResets", "InSegs", "OutSegs", "RetransSegs",
                "InErrs", "OutRsts", "InCsumErrors")
TCPEXT_COUNTERS = ("TCPTimeouts", "TCPLostRetransmit", "TCPSynRetrans", "ListenOverflows", "ListenDrops",
                   "TCPRcvQDrop", "TCPFastRetrans")
THROTTLE_REASONS = ("gpu_idle", "sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
EFA_MTU = 8928
MHZ = 1_000_000


@dataclass
class GpuState:
    index: int
    uuid: str
    serial: str
    bus_id: str  # NVML form: 00000000:53:00.0
    utilization: float = 0.0
    memory_utilization: float = 0.0
    memory_used_bytes: int = 0
    temperature_c: float = 35.0
    memory_temperature_c: float = 40.0
    power_w: float = 70.0
    energy_j: float = 0.0
    sm_clock_mhz: float = 0.0
    mem_clock_mhz: float = 0.0
    throttle: set[str] = field(default_factory=set)
    throttle_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(THROTTLE_REASONS, 0.0))
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    pcie_replays: int = 0
    lost: bool = False
    xids: list[int] = field(default_factory=list)  # Xids logged so far, in order

    @property
    def pci_short(self) -> str:
        """The kernel log's form: 4-hex domain, bus, device, no function (0000:53:00)."""
        domain, bus, rest = self.bus_id.split(":")
        return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}".lower()


@dataclass
class EfaState:
    name: str
    pci_address: str
    node_guid: str
    port: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EFA_PORT_COUNTERS, 0))
    device: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EFA_DEVICE_COUNTERS, 0))
    present: bool = True


@dataclass
class NicState:
    name: str
    address: str
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(NETDEV_COUNTERS, 0))
    ena: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENA_COUNTERS, 0))
    carrier_changes: int = 1


@dataclass
class Load:
    """What the training jobs on this node are doing this tick."""

    gpu_busy: dict[int, float] = field(default_factory=dict)  # gpu index -> 0..1
    network: float = 0.0  # 0..1 of the node's usual collective traffic


class NodeModel:
    """State of one node, advanced by :meth:`tick`; faults are applied on top of the base model."""

    def __init__(self, name: str, index: int, profile: NodeProfile, seed: int) -> None:
        self.name = name
        self.index = index
        self.profile = profile
        self.rng = random.Random(seed)
        self.boot_time = 1_700_000_000.0 + index
        self.uptime = 3600.0 * (5 + index)
        self.gpus = [
            GpuState(
                index=i,
                uuid=f"GPU-{seed:08x}-{index:04x}-{i:04x}-8000-{self.rng.getrandbits(48):012x}",
                serial=f"165{index:04d}{i:05d}",
                bus_id=f"00000000:{bus:02X}:00.0",
            )
            for i, bus in enumerate(profile.gpu_bus_ids)
        ]
        self.efa = [
            EfaState(name=dev, pci_address=_efa_pci(dev), node_guid=f"0{index:03x}:{i:04x}:{seed & 0xffff:04x}:fe80")
            for i, dev in enumerate(profile.efa_devices)
        ]
        self.nics = [
            NicState(name=ifname, address=f"0a:{index:02x}:{i:02x}:5e:{seed & 0xff:02x}:01")
            for i, ifname in enumerate(profile.ena_interfaces)
        ]
        self.nics[0].ena["conntrack_allowance_available"] = 500_000
        self.tcp = dict.fromkeys(TCP_COUNTERS, 0)
        self.tcp_ext = dict.fromkeys(TCPEXT_COUNTERS, 0)
        self.new_kmsg: list[str] = []  # kernel log lines produced since the last drain
        self._xids_done: set[tuple[int, int]] = set()  # (fault id, repeat) already logged
        for efa in self.efa:
            efa.device["submitted_cmds"] = efa.device["completed_cmds"] = 1200 + 7 * index
        for gpu in self.gpus:
            gpu.ecc_corrected = self.rng.randrange(0, 3)

    # -- the tick -------------------------------------------------------------------------------

    def tick(self, dt: float, elapsed: float, load: Load, faults: Iterable[Fault]) -> None:
        """Advance ``dt`` seconds at simulation time ``elapsed`` under ``load`` and the active faults."""
        self.uptime += dt
        active = [f for f in faults if f.node == self.name and f.active(elapsed)]
        self._tick_gpus(dt, load, active)
        self._tick_efa(dt, load, active)
        self._tick_nics(dt, load, active)
        self._tick_tcp(dt, load, active)
        self._log_xids(faults, elapsed)

    def _jitter(self, spread: float) -> float:
        return 1.0 + self.rng.uniform(-spread, spread)

    def _count(self, mean: float) -> int:
        """A whole number of events with the given mean (fractions carry by chance)."""
        whole = int(mean)
        return whole + (1 if self.rng.random() < mean - whole else 0)

    def _tick_gpus(self, dt: float, load: Load, active: list[Fault]) -> None:
        model = self.profile.gpu
        for gpu in self.gpus:
            busy = load.gpu_busy.get(gpu.index, 0.0)
            mine = [f for f in active if f.gpu == gpu.index]
            clock_ratio = 1.0
            throttle: set[str] = set()
            target_temp = 38.0 + 30.0 * busy
            if busy < 0.05:
                throttle.add("gpu_idle")
            for fault in mine:
                if fault.kind == "thermal_throttle":
                    clock_ratio = min(clock_ratio, fault.param("clock_ratio"))
                    throttle |= {"sw_thermal", "hw_thermal"}
                    target_temp = fault.param("temperature")
                elif fault.kind == "hw_slowdown":
                    clock_ratio = min(clock_ratio, fault.param("clock_ratio"))
                    throttle |= {"hw_slowdown", "hw_power_brake"}
                elif fault.kind == "ecc_uncorrectable" and gpu.ecc_uncorrected < int(fault.param("count")):
                    gpu.ecc_uncorrected = int(fault.param("count"))
                    gpu.remapped_uncorrectable = max(gpu.remapped_uncorrectable, 1)
                    # The driver logs the double-bit error as it counts it: Xid 48, beside the ECC counter.
                    gpu.xids.append(48)
                    self.new_kmsg.append(xid_line(gpu, 48))
                elif fault.kind == "row_remap_pending":
                    gpu.remap_pending = True
                elif fault.kind == "xid" and int(fault.param("xid")) == 79:
                    gpu.lost = True
            gpu.throttle = throttle
            for reason in throttle:
                gpu.throttle_seconds[reason] += dt
            gpu.utilization = min(1.0, busy * self._jitter(0.03)) if busy > 0 else 0.0
            gpu.memory_utilization = 0.45 * gpu.utilization * self._jitter(0.05)
            gpu.memory_used_bytes = int(model.memory_bytes * (0.02 + 0.85 * min(1.0, busy * 5)))
            # Temperatures relax toward their target (a few seconds' thermal inertia).
            gpu.temperature_c += (target_temp * self._jitter(0.01) - gpu.temperature_c) * min(1.0, dt / 8.0)
            gpu.memory_temperature_c = gpu.temperature_c + 6.0
            gpu.power_w = (model.idle_power_w + (model.busy_power_w - model.idle_power_w) * gpu.utilization) \
                * clock_ratio ** 0.5 * self._jitter(0.02)
            gpu.energy_j += gpu.power_w * dt
            gpu.sm_clock_mhz = round(model.sm_clock_max_mhz * clock_ratio * (1.0 if busy > 0.05 else 0.18))
            gpu.mem_clock_mhz = model.mem_clock_max_mhz
            if self.rng.random() < 0.002 * dt:
                gpu.ecc_corrected += 1

    def _tick_efa(self, dt: float, load: Load, active: list[Fault]) -> None:
        # A busy p5 moves a few GB/s per EFA device during collectives.
        per_device_bps = 2.5e9 * load.network * (32 / max(1, self.profile.efa_count)) ** 0.5
        for efa in self.efa:
            mine = [f for f in active if f.device in (None, efa.name) and f.spec.target == "efa"]
            efa.present = not any(f.kind == "efa_device_missing" for f in mine)
            if not efa.present:
                continue
            port = efa.port
            for direction in ("tx", "rx"):
                moved = int(per_device_bps * dt * self._jitter(0.08))
                port[f"{direction}_bytes"] += moved
                port[f"{direction}_pkts"] += moved // EFA_MTU
            read = int(per_device_bps * 0.6 * dt * self._jitter(0.1))
            port["rdma_read_bytes"] += read
            port["rdma_read_resp_bytes"] += read
            port["rdma_read_wrs"] += read // (1 << 20)
            write = int(per_device_bps * 0.3 * dt * self._jitter(0.1))
            port["rdma_write_bytes"] += write
            port["rdma_write_recv_bytes"] += write
            port["rdma_write_wrs"] += write // (1 << 20)
            small = int(2e6 * max(load.network, 0.01) * dt * self._jitter(0.2))
            port["send_bytes"] += small
            port["recv_bytes"] += small
            port["send_wrs"] += small // 4096
            port["recv_wrs"] += small // 4096
            # A healthy fabric retransmits almost nothing.
            port["retrans_pkts"] += self._count(0.02 * dt * load.network)
            for fault in mine:
                if fault.kind == "efa_retransmits":
                    extra = self._count(fault.param("packets_per_second") * dt * self._jitter(0.2))
                    port["retrans_pkts"] += extra
                    port["retrans_bytes"] += extra * EFA_MTU
                    port["retrans_timeout_events"] += self._count(fault.param("timeouts_per_second") * dt)
                elif fault.kind == "efa_impaired":
                    port["impaired_remote_conn_events"] += self._count(fault.param("events_per_second") * dt)
                    port["unresponsive_remote_events"] += self._count(0.5 * fault.param("events_per_second") * dt)
                elif fault.kind == "efa_rx_drops":
                    port["rx_drops"] += self._count(fault.param("drops_per_second") * dt * self._jitter(0.2))
            port["retrans_bytes"] = max(port["retrans_bytes"], port["retrans_pkts"] * 1024)
            keep_alives = self._count(dt)
            efa.device["keep_alive_rcvd"] += keep_alives
            cmds = self._count(0.2 * dt)
            efa.device["submitted_cmds"] += cmds
            efa.device["completed_cmds"] += cmds

    def _tick_nics(self, dt: float, load: Load, active: list[Fault]) -> None:
        for nic in self.nics:
            mine = [f for f in active if f.spec.target == "ena" and f.device in (None, nic.name)]
            # Checkpoint/data traffic plus bootstrap chatter: tens of MB/s.
            rate = 4e7 * (0.2 + load.network) * self._jitter(0.15)
            for direction in ("rx", "tx"):
                moved = int(rate * dt)
                nic.stats[f"{direction}_bytes"] += moved
                nic.stats[f"{direction}_packets"] += moved // 1500
            for fault in mine:
                shaped = self._count(fault.param("packets_per_second") * dt * self._jitter(0.2))
                if fault.kind == "ena_pps_exceeded":
                    nic.ena["pps_allowance_exceeded"] += shaped
                elif fault.kind == "ena_bw_exceeded":
                    nic.ena["bw_out_allowance_exceeded"] += shaped
                    nic.ena["bw_in_allowance_exceeded"] += shaped // 2
            nic.ena["conntrack_allowance_available"] = 500_000 - self.rng.randrange(0, 200)

    def _tick_tcp(self, dt: float, load: Load, active: list[Fault]) -> None:
        out = int(3000 * (0.3 + load.network) * dt * self._jitter(0.1))
        self.tcp["OutSegs"] += out
        self.tcp["InSegs"] += int(out * 0.98)
        ratio = 0.0005
        for fault in active:
            if fault.kind == "tcp_retransmit_storm":
                ratio = max(ratio, fault.param("ratio"))
        retrans = self._count(out * ratio * self._jitter(0.2))
        self.tcp["RetransSegs"] += retrans
        self.tcp_ext["TCPTimeouts"] += self._count(retrans * 0.2)
        self.tcp_ext["TCPLostRetransmit"] += self._count(retrans * 0.05)
        self.tcp_ext["TCPFastRetrans"] += self._count(retrans * 0.6)
        self.tcp["ActiveOpens"] += self._count(0.05 * dt)
        self.tcp["PassiveOpens"] += self._count(0.05 * dt)

    def _log_xids(self, faults: Iterable[Fault], elapsed: float) -> None:
        for fault_id, fault in enumerate(faults):
            if fault.kind != "xid" or fault.node != self.name or not fault.active(elapsed) or fault.gpu is None:
                continue
            gpu = self.gpus[fault.gpu]
            xid = int(fault.param("xid"))
            for repeat in range(max(1, int(fault.param("count")))):
                key = (fault_id, repeat)
                if key in self._xids_done:
                    continue
                self._xids_done.add(key)
                gpu.xids.append(xid)
                self.new_kmsg.append(xid_line(gpu, xid))

    def drain_kmsg(self) -> list[str]:
        lines, self.new_kmsg = self.new_kmsg, []
        return lines


XID_TEXT = {
    79: "GPU has fallen off the bus.",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
        "subpartition 0.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
}


def xid_line(gpu: GpuState, xid: int) -> str:
    """The driver's message for one Xid, in the current (R470+) format."""
    text = XID_TEXT.get(xid, "Graphics Exception")
    if xid == 79:
        return f"NVRM: Xid (PCI:{gpu.pci_short}): 79, pid='<unknown>', name=<unknown>, {text}"
    return f"NVRM: Xid (PCI:{gpu.pci_short}): {xid}, pid=4242, name=python3, {text}"


def _efa_pci(device: str) -> str:
    """PCI address back from an rdmap<bus>s<slot> name (decimal bus and slot)."""
    body = device.removeprefix("rdmap")
    bus, _, slot = body.partition("s")
    return f"0000:{int(bus):02x}:{int(slot):02x}.0"
