"""Writers for sysfs/procfs trees shaped like a GPU node's, for tests and the simulator.

The trees follow the kernel's layout closely enough for the real sources to
read them: ``class/infiniband/<dev>/device`` and ``class/net/<if>/device`` are
relative symlinks into ``devices/pci<domain>:<bus>/<address>`` (as in sysfs),
the PCI function has ``vendor``/``device``/``numa_node`` and a ``driver``
link, and ``net/snmp`` / ``net/netstat`` are header/value line pairs.

Counter values are written as given, so a caller can also write malformed
text (``"N/A (no PMA)"``, garbage, ``""``) or pass :data:`DIRECTORY` to put a
directory where a file is expected. Standard library only: the simulator
imports this at run time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class _Directory:
    """Marker: create a directory where a counter file would be."""

    def __repr__(self) -> str:
        return "DIRECTORY"


DIRECTORY = _Directory()

CounterValue = int | str | _Directory

EFA_VENDOR = "0x1d0f"
# Counters that AWS names per scope since the 2021 split (amzn-drivers efa_verbs.c), in sysfs order.
EFA_PORT_BASIC = ("tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops")
EFA_PORT_MESSAGES = ("send_bytes", "send_wrs", "recv_bytes", "recv_wrs")
EFA_PORT_RDMA_READ = ("rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes")
EFA_PORT_RDMA_WRITE = ("rdma_write_wrs", "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes")
EFA_PORT_NETWORK = (
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)
EFA_DEVICE_ADMIN = ("submitted_cmds", "completed_cmds", "cmds_err", "no_completion_cmds", "keep_alive_rcvd")
EFA_DEVICE_VERBS = (
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
)
EFA_DEVICE_KVERBS = ("alloc_mr_err", "get_dma_mr_err")


def rdma_pci_name(pci_address: str) -> str:
    """rdma-core's persistent name for a PCI function: ``0000:10:1b.0`` -> ``rdmap16s27`` (decimal)."""
    domain, bus, rest = pci_address.split(":")
    slot, func = rest.split(".")
    name = "rdma"
    if int(domain, 16):
        name += f"P{int(domain, 16)}"
    name += f"p{int(bus, 16)}s{int(slot, 16)}"
    if int(func, 16):
        name += f"f{int(func, 16)}"
    return name


def _write(path: str, value: CounterValue) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if isinstance(value, _Directory):
        os.makedirs(path, exist_ok=True)
        # git keeps no empty directory: give it a file so the tree survives a commit
        _write(os.path.join(path, "value"), "0")
        return
    with open(path, "w", encoding="ascii") as handle:
        handle.write(f"{value}\n")


def _symlink(target: str, link: str) -> None:
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(target, link)


def _write_counters(directory: str, counters: Mapping[str, CounterValue], lifespan: int | None) -> None:
    os.makedirs(directory, exist_ok=True)
    for name, value in counters.items():
        _write(os.path.join(directory, name), value)
    if lifespan is not None:
        _write(os.path.join(directory, "lifespan"), lifespan)


def write_pci_function(
    sys_root: str,
    pci_address: str,
    *,
    vendor: str,
    device_id: str,
    driver: str | None,
    numa_node: int = -1,
    local_cpulist: str = "",
    pci_class: str = "0x020000",
) -> str:
    """``devices/pci<domain>:<bus>/<address>`` with its IDs and a ``driver`` link; returns its path
    relative to ``sys_root``."""
    domain, bus, _ = pci_address.split(":")
    relative = os.path.join("devices", f"pci{domain}:{bus}", pci_address)
    path = os.path.join(sys_root, relative)
    _write(os.path.join(path, "vendor"), vendor)
    _write(os.path.join(path, "device"), device_id)
    _write(os.path.join(path, "class"), pci_class)
    _write(os.path.join(path, "numa_node"), numa_node)
    if local_cpulist:
        _write(os.path.join(path, "local_cpulist"), local_cpulist)
    if driver:
        driver_dir = os.path.join(sys_root, "bus", "pci", "drivers", driver)
        for attr in ("bind", "unbind"):
            if not os.path.exists(os.path.join(driver_dir, attr)):
                _write(os.path.join(driver_dir, attr), "")
        _symlink(
            os.path.join("..", "..", "..", "bus", "pci", "drivers", driver), os.path.join(path, "driver")
        )
    return relative


def write_efa_device(
    sys_root: str,
    name: str,
    pci_address: str,
    port_counters: Mapping[str, CounterValue] | None,
    device_counters: Mapping[str, CounterValue] | None,
    *,
    port: int = 1,
    vendor: str = EFA_VENDOR,
    device_id: str = "0xefa1",
    driver: str | None = "efa",
    numa_node: int = 0,
    local_cpulist: str = "",
    node_guid: str = "",
    fw_ver: str = "",
    rate: str = "100 Gb/sec (4X EDR)",
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    link_layer: str = "Unknown",
    lifespan: int | None = 12,
    extra_port_dirs: Mapping[str, Mapping[str, CounterValue]] | None = None,
) -> str:
    """One RDMA device under ``class/infiniband/<name>`` (EFA by default); returns its directory.

    ``port_counters`` go to ``ports/<port>/hw_counters/`` and ``device_counters`` to
    ``hw_counters/``; ``None`` leaves that directory out (as in a non-init netns).
    ``extra_port_dirs`` adds other per-port directories (e.g. a PMA ``counters``).
    """
    pci_relative = write_pci_function(
        sys_root,
        pci_address,
        vendor=vendor,
        device_id=device_id,
        driver=driver,
        numa_node=numa_node,
        local_cpulist=local_cpulist,
    )
    device_dir = os.path.join(sys_root, "class", "infiniband", name)
    os.makedirs(device_dir, exist_ok=True)
    # class/infiniband/<dev> is three levels below the sysfs root
    _symlink(os.path.join("..", "..", "..", pci_relative), os.path.join(device_dir, "device"))
    guid = node_guid or _guid_from_pci(pci_address)
    attrs = {
        "node_guid": guid,
        "sys_image_guid": guid,
        "node_type": "1: CA",
        "node_desc": f"{name} node",
        "fw_ver": fw_ver,
    }
    for attr, value in attrs.items():
        _write(os.path.join(device_dir, attr), value)
    port_dir = os.path.join(device_dir, "ports", str(port))
    port_attrs = {
        "state": state,
        "phys_state": phys_state,
        "rate": rate,
        "link_layer": link_layer,
        "lid": "0x0",
        "sm_lid": "0x0",
        "cap_mask": "0x00010000",
    }
    for attr, value in port_attrs.items():
        _write(os.path.join(port_dir, attr), value)
    if port_counters is not None:
        _write_counters(os.path.join(port_dir, "hw_counters"), port_counters, lifespan)
    if device_counters is not None:
        _write_counters(os.path.join(device_dir, "hw_counters"), device_counters, lifespan)
    for sub, counters in (extra_port_dirs or {}).items():
        _write_counters(os.path.join(port_dir, sub), counters, None)
    return device_dir


def _guid_from_pci(pci_address: str) -> str:
    digits = "".join(c for c in pci_address if c.isalnum())[-12:].rjust(12, "0")
    return f"0000:{digits[0:4]}:{digits[4:8]}:{digits[8:12]}"


NETDEV_STATISTICS = (
    "collisions",
    "multicast",
    "rx_bytes",
    "rx_compressed",
    "rx_crc_errors",
    "rx_dropped",
    "rx_errors",
    "rx_fifo_errors",
    "rx_frame_errors",
    "rx_length_errors",
    "rx_missed_errors",
    "rx_nohandler",
    "rx_over_errors",
    "rx_packets",
    "tx_aborted_errors",
    "tx_bytes",
    "tx_carrier_errors",
    "tx_compressed",
    "tx_dropped",
    "tx_errors",
    "tx_fifo_errors",
    "tx_heartbeat_errors",
    "tx_packets",
    "tx_window_errors",
)


def write_netdev(
    sys_root: str,
    name: str,
    stats: Mapping[str, CounterValue],
    *,
    operstate: str = "up",
    carrier: CounterValue | None = 1,
    carrier_changes: CounterValue | None = 2,
    speed: CounterValue | None = None,
    mtu: CounterValue = 1500,
    address: str = "00:00:00:00:00:00",
    pci_address: str | None = None,
    driver: str | None = None,
    vendor: str = "0x1d0f",
    device_id: str = "0xec20",
    numa_node: int = 0,
) -> str:
    """One interface under ``class/net/<name>``; returns its directory.

    With ``pci_address`` it is a physical function (a ``device`` link and a
    driver), otherwise a virtual interface. Statistics not in ``stats`` are
    written as 0 (the kernel always has all of them); ``speed=None`` leaves the
    file out.
    """
    net_dir = os.path.join(sys_root, "class", "net", name)
    os.makedirs(net_dir, exist_ok=True)
    for stat in NETDEV_STATISTICS:
        if stat not in stats:
            _write(os.path.join(net_dir, "statistics", stat), 0)
    for stat, value in stats.items():
        _write(os.path.join(net_dir, "statistics", stat), value)
    attrs: dict[str, CounterValue | None] = {
        "operstate": operstate,
        "carrier": carrier,
        "carrier_changes": carrier_changes,
        "speed": speed,
        "mtu": mtu,
        "address": address,
        "type": 772 if name == "lo" else 1,
    }
    for attr, attr_value in attrs.items():
        if attr_value is not None:
            _write(os.path.join(net_dir, attr), attr_value)
    if pci_address:
        pci_relative = write_pci_function(
            sys_root,
            pci_address,
            vendor=vendor,
            device_id=device_id,
            driver=driver,
            numa_node=numa_node,
        )
        _symlink(os.path.join("..", "..", "..", pci_relative), os.path.join(net_dir, "device"))
    return net_dir


def _pairs(sections: Mapping[str, Mapping[str, CounterValue]]) -> str:
    lines: list[str] = []
    for section, fields in sections.items():
        lines.append(f"{section}: " + " ".join(fields))
        lines.append(f"{section}: " + " ".join(str(v) for v in fields.values()))
    return "\n".join(lines) + "\n"


def write_proc_net(
    proc_root: str,
    snmp: Mapping[str, Mapping[str, CounterValue]],
    netstat: Mapping[str, Mapping[str, CounterValue]],
) -> None:
    """``net/snmp`` and ``net/netstat`` under ``proc_root``: one header line and one value line per
    section, fields in the order given."""
    _write_text(os.path.join(proc_root, "net", "snmp"), _pairs(snmp))
    _write_text(os.path.join(proc_root, "net", "netstat"), _pairs(netstat))


def _write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


# -- instance profiles --------------------------------------------------------------------------

# PCI functions of the EFA devices; names follow from rdma_pci_name(). p5.48xlarge names as
# observed (awsome-distributed-training efa-node-exporter README), p4d.24xlarge likewise.
P5_EFA_PCI_ADDRESSES = tuple(
    f"0000:{bus:02x}:00.0"
    for first in (79, 96, 113, 130, 147, 164, 181, 198)
    for bus in range(first, first + 4)
)
P4D_EFA_PCI_ADDRESSES = tuple(f"0000:{bus:02x}:1b.0" for bus in (16, 32, 144, 160))


def numa_node_of(pci_address: str) -> int:
    """Two-socket nodes: the upper half of the PCI buses hangs off the second socket."""
    return 0 if int(pci_address.split(":")[1], 16) < 0x80 else 1


# The kernel prints the same fields for Udp and UdpLite.
_UDP_FIELDS = (
    "InDatagrams",
    "NoPorts",
    "InErrors",
    "OutDatagrams",
    "RcvbufErrors",
    "SndbufErrors",
    "InCsumErrors",
    "IgnoredMulti",
    "MemErrors",
)

# Field names of /proc/net/snmp and /proc/net/netstat on a 6.x kernel, in kernel order.
SNMP_FIELDS: dict[str, tuple[str, ...]] = {
    "Ip": (
        "Forwarding",
        "DefaultTTL",
        "InReceives",
        "InHdrErrors",
        "InAddrErrors",
        "ForwDatagrams",
        "InUnknownProtos",
        "InDiscards",
        "InDelivers",
        "OutRequests",
        "OutDiscards",
        "OutNoRoutes",
        "ReasmTimeout",
        "ReasmReqds",
        "ReasmOKs",
        "ReasmFails",
        "FragOKs",
        "FragFails",
        "FragCreates",
        "OutTransmits",
    ),
    "Icmp": (
        "InMsgs",
        "InErrors",
        "InCsumErrors",
        "InDestUnreachs",
        "InTimeExcds",
        "InParmProbs",
        "InSrcQuenchs",
        "InRedirects",
        "InEchos",
        "InEchoReps",
        "InTimestamps",
        "InTimestampReps",
        "InAddrMasks",
        "InAddrMaskReps",
        "OutMsgs",
        "OutErrors",
        "OutRateLimitGlobal",
        "OutRateLimitHost",
        "OutDestUnreachs",
        "OutTimeExcds",
        "OutParmProbs",
        "OutSrcQuenchs",
        "OutRedirects",
        "OutEchos",
        "OutEchoReps",
        "OutTimestamps",
        "OutTimestampReps",
        "OutAddrMasks",
        "OutAddrMaskReps",
    ),
    "IcmpMsg": ("InType3", "InType8", "OutType0", "OutType3"),
    "Tcp": (
        "RtoAlgorithm",
        "RtoMin",
        "RtoMax",
        "MaxConn",
        "ActiveOpens",
        "PassiveOpens",
        "AttemptFails",
        "EstabResets",
        "CurrEstab",
        "InSegs",
        "OutSegs",
        "RetransSegs",
        "InErrs",
        "OutRsts",
        "InCsumErrors",
    ),
    "Udp": _UDP_FIELDS,
    "UdpLite": _UDP_FIELDS,
}
NETSTAT_FIELDS: dict[str, tuple[str, ...]] = {
    "TcpExt": (
        "SyncookiesSent",
        "SyncookiesRecv",
        "SyncookiesFailed",
        "EmbryonicRsts",
        "PruneCalled",
        "RcvPruned",
        "OfoPruned",
        "OutOfWindowIcmps",
        "LockDroppedIcmps",
        "ArpFilter",
        "TW",
        "TWRecycled",
        "TWKilled",
        "PAWSActive",
        "PAWSEstab",
        "DelayedACKs",
        "DelayedACKLocked",
        "DelayedACKLost",
        "ListenOverflows",
        "ListenDrops",
        "TCPHPHits",
        "TCPPureAcks",
        "TCPHPAcks",
        "TCPRenoRecovery",
        "TCPSackRecovery",
        "TCPSACKReneging",
        "TCPSACKReorder",
        "TCPRenoReorder",
        "TCPTSReorder",
        "TCPFullUndo",
        "TCPPartialUndo",
        "TCPDSACKUndo",
        "TCPLossUndo",
        "TCPLostRetransmit",
        "TCPRenoFailures",
        "TCPSackFailures",
        "TCPLossFailures",
        "TCPFastRetrans",
        "TCPSlowStartRetrans",
        "TCPTimeouts",
        "TCPLossProbes",
        "TCPLossProbeRecovery",
        "TCPRenoRecoveryFail",
        "TCPSackRecoveryFail",
        "TCPRcvCollapsed",
        "TCPDSACKOldSent",
        "TCPDSACKOfoSent",
        "TCPDSACKRecv",
        "TCPDSACKOfoRecv",
        "TCPAbortOnData",
        "TCPAbortOnClose",
        "TCPAbortOnMemory",
        "TCPAbortOnTimeout",
        "TCPAbortOnLinger",
        "TCPAbortFailed",
        "TCPMemoryPressures",
        "TCPMemoryPressuresChrono",
        "TCPSACKDiscard",
        "TCPDSACKIgnoredOld",
        "TCPDSACKIgnoredNoUndo",
        "TCPSpuriousRTOs",
        "TCPMD5NotFound",
        "TCPMD5Unexpected",
        "TCPMD5Failure",
        "TCPSackShifted",
        "TCPSackMerged",
        "TCPSackShiftFallback",
        "TCPBacklogCoalesce",
        "TCPBacklogDrop",
        "PFMemallocDrop",
        "TCPMinTTLDrop",
        "TCPDeferAcceptDrop",
        "IPReversePathFilter",
        "TCPTimeWaitOverflow",
        "TCPReqQFullDoCookies",
        "TCPReqQFullDrop",
        "TCPRetransFail",
        "TCPRcvCoalesce",
        "TCPOFOQueue",
        "TCPOFODrop",
        "TCPOFOMerge",
        "TCPChallengeACK",
        "TCPSYNChallenge",
        "TCPFastOpenActive",
        "TCPFastOpenActiveFail",
        "TCPFastOpenPassive",
        "TCPFastOpenPassiveFail",
        "TCPFastOpenListenOverflow",
        "TCPFastOpenCookieReqd",
        "TCPFastOpenBlackhole",
        "TCPSpuriousRtxHostQueues",
        "BusyPollRxPackets",
        "TCPAutoCorking",
        "TCPFromZeroWindowAdv",
        "TCPToZeroWindowAdv",
        "TCPWantZeroWindowAdv",
        "TCPSynRetrans",
        "TCPOrigDataSent",
        "TCPHystartTrainDetect",
        "TCPHystartTrainCwnd",
        "TCPHystartDelayDetect",
        "TCPHystartDelayCwnd",
        "TCPACKSkippedSynRecv",
        "TCPACKSkippedPAWS",
        "TCPACKSkippedSeq",
        "TCPACKSkippedFinWait2",
        "TCPACKSkippedTimeWait",
        "TCPACKSkippedChallenge",
        "TCPWinProbe",
        "TCPKeepAlive",
        "TCPMTUPFail",
        "TCPMTUPSuccess",
        "TCPDelivered",
        "TCPDeliveredCE",
        "TCPAckCompressed",
        "TCPZeroWindowDrop",
        "TCPRcvQDrop",
        "TCPWqueueTooBig",
        "TCPFastOpenPassiveAltKey",
        "TcpTimeoutRehash",
        "TcpDuplicateDataRehash",
        "TCPDSACKRecvSegs",
        "TCPDSACKIgnoredDubious",
        "TCPMigrateReqSuccess",
        "TCPMigrateReqFailure",
        "TCPPLBRehash",
        "TCPAORequired",
        "TCPAOBad",
        "TCPAOKeyNotFound",
        "TCPAOGood",
        "TCPAODroppedIcmps",
    ),
    "IpExt": (
        "InNoRoutes",
        "InTruncatedPkts",
        "InMcastPkts",
        "OutMcastPkts",
        "InBcastPkts",
        "OutBcastPkts",
        "InOctets",
        "OutOctets",
        "InMcastOctets",
        "OutMcastOctets",
        "InBcastOctets",
        "OutBcastOctets",
        "InCsumErrors",
        "InNoECTPkts",
        "InECT1Pkts",
        "InECT0Pkts",
        "InCEPkts",
        "ReasmOverlaps",
    ),
    "MPTcpExt": ("MPCapableSYNRX", "MPCapableSYNTX", "MPCapableSYNACKRX", "MPCapableACKRX"),
}
