"""The kernel's files as the collectors read them: the one writer of sysfs, procfs and kernel-log trees.

The simulator (a node that moves every tick), the test fixtures (``tests/fixtures/make_fixtures.py``) and
the benchmarks write their trees through this module, so there is one idea of the layout, the kernel's:

* a PCI function is ``devices/pci<domain>:<bus>/<address>`` with ``vendor``, ``device``, ``class`` and
  ``numa_node``, a ``driver`` link into ``bus/pci/drivers/<driver>``, and ``bus/pci/devices/<address>``
  links to it;
* an RDMA device lives below its function (``<function>/infiniband/<name>``), ``class/infiniband/<name>``
  links to it and its ``device`` link points back up to the function; a network interface likewise
  (``<function>/net/<name>``), or ``devices/virtual/net/<name>`` when it has no device;
* ``net/snmp`` and ``net/netstat`` are header/value line pairs, ``net/dev`` a two-line header and one line
  per interface; the kernel log holds ``/dev/kmsg`` records.

Values are written as given, with the newline sysfs ends every attribute with, so a caller can also write
malformed text (``"N/A (no PMA)"``, ``""``, garbage) or :data:`DIRECTORY` where a file is expected.
Every file is replaced atomically (temporary file, rename): a reader racing with a simulator tick sees
the old or the new value, never a torn number that would look like a counter reset. Unchanged files are
not rewritten (a p5 tree has about a thousand counters). Standard library only.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping


class _Directory:
    """Marker: create a directory where a counter file would be."""

    def __repr__(self) -> str:
        return "DIRECTORY"


DIRECTORY = _Directory()

CounterValue = int | str | _Directory

EFA_VENDOR = "0x1d0f"
# Counters the EFA driver creates, per scope since the 2021 split (amzn-drivers efa_verbs.c), in sysfs order.
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

# Every statistics/ file of a network interface (the kernel always has all of them).
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
ARPHRD_ETHER, ARPHRD_LOOPBACK = 1, 772


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


class FileTree:
    """Files below one root, written atomically, each rewritten only when its content changes."""

    def __init__(self, root: str, atomic: bool = True) -> None:
        self.root = root
        # Each file is replaced whole by a rename, as a reader in another process must never see half of it. A
        # tree read only between writes (the virtual run reads in the writer's own thread) may rewrite in place.
        self.atomic = atomic
        self._written: dict[str, str] = {}  # relative path -> content last written
        self._links: dict[str, str] = {}  # relative path -> link text last written
        self._link_targets: dict[str, str] = {}  # relative path -> the target it was asked to link to
        self._dirs: set[str] = set()  # absolute directories made (a tree rewritten every tick asks again and again)
        # What a group of attribute files was last written from (a device's IDs and settings): the same again
        # rewrites nothing, so the group is skipped without looking at each file. Forgotten by any remove().
        self._attributes: dict[str, tuple[object, ...]] = {}

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def write(self, relative: str, value: CounterValue) -> None:
        """One attribute: the value and a newline (or a directory for :data:`DIRECTORY`)."""
        if isinstance(value, _Directory):
            os.makedirs(self.path(relative), exist_ok=True)
            # git keeps no empty directory: give it a file so a committed tree keeps it
            self.write(os.path.join(relative, "value"), 0)
            return
        self.write_text(relative, f"{value}\n")

    def write_text(self, relative: str, text: str) -> None:
        if self._written.get(relative) == text:
            return
        path = self.path(relative)
        directory = os.path.dirname(path)
        self._makedirs(directory)
        if not self.atomic:
            self._overwrite(path, text)
            self._written[relative] = text
            return
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            handle = open(temporary, "w", encoding="utf-8")  # noqa: SIM115 - closed below
        except FileNotFoundError:  # its directory was removed behind this tree's back (an unplugged device)
            self._dirs.discard(directory)
            self._makedirs(directory)
            handle = open(temporary, "w", encoding="utf-8")  # noqa: SIM115
        with handle:
            handle.write(text)
        os.replace(temporary, path)
        self._written[relative] = text

    @staticmethod
    def _overwrite(path: str, text: str) -> None:
        """Rewrite a file in place with plain system calls: the new bytes over the old, then cut to their length.
        Not opened with O_TRUNC: emptying a file frees its block and the write takes one again, every tick."""
        data = text.encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            os.write(fd, data)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def append_text(self, relative: str, text: str) -> None:
        """Add to the end of a log file (never rewritten: a reader keeps its position)."""
        path = self.path(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(text)

    def mkdir(self, relative: str) -> None:
        self._makedirs(self.path(relative))

    def _makedirs(self, directory: str) -> None:
        if directory not in self._dirs:
            os.makedirs(directory, exist_ok=True)
            self._dirs.add(directory)

    def link(self, relative: str, target: str) -> None:
        """A relative symlink at ``relative`` to ``target`` (both below the root), as the kernel writes them:
        up to the target's parent, then down by its name (``device -> ../../../0000:10:1b.0``)."""
        if self._link_targets.get(relative) == target and relative in self._links:
            return
        path = self.path(relative)
        parent = os.path.relpath(self.path(os.path.dirname(target)), os.path.dirname(path))
        text = os.path.normpath(os.path.join(parent, os.path.basename(target)))
        self._link_targets[relative] = target
        if self._links.get(relative) == text:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Made under a temporary name and renamed over whatever is there, as files are written: several processes
        # may write one tree (the daemons a benchmark starts on one node's tree each install its GPUs' sysfs), and
        # a link checked absent and then created raced another writer's (FileExistsError, or rmtree called on the
        # link the other had just made).
        temporary = f"{path}.{os.getpid()}.tmp"
        if os.path.lexists(temporary):  # left by a writer killed between the two calls
            os.unlink(temporary)
        os.symlink(text, temporary)
        try:
            os.replace(temporary, path)
        except IsADirectoryError:  # a directory (not a link to one) where the link goes: rename cannot replace it
            shutil.rmtree(path, ignore_errors=True)  # another writer may have replaced it with its link already
            os.replace(temporary, path)
        self._links[relative] = text

    def remove(self, relative: str) -> None:
        """Remove a file, link or directory (and forget what was written below it)."""
        path = self.path(relative)
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)
        below = relative.rstrip(os.sep) + os.sep
        self._attributes.clear()
        for cache in (self._written, self._links, self._link_targets):
            for key in [k for k in cache if k == relative or k.startswith(below)]:
                del cache[key]
        gone = path.rstrip(os.sep)
        self._dirs = {d for d in self._dirs if d != gone and not d.startswith(gone + os.sep)}


class SysfsTree(FileTree):
    """A sysfs mount: PCI functions, RDMA devices and network interfaces."""

    def pci_function(
        self,
        address: str,
        *,
        vendor: str,
        device_id: str,
        driver: str | None = None,
        numa_node: int = -1,
        local_cpulist: str = "",
        pci_class: str = "0x020000",
    ) -> str:
        """``devices/pci<domain>:<bus>/<address>`` with its IDs, its ``driver`` link and its
        ``bus/pci/devices`` entry; returns its path relative to the root."""
        domain, bus, _ = address.split(":")
        function = os.path.join("devices", f"pci{domain}:{bus}", address)
        self.write(os.path.join(function, "vendor"), vendor)
        self.write(os.path.join(function, "device"), device_id)
        self.write(os.path.join(function, "class"), pci_class)
        self.write(os.path.join(function, "numa_node"), numa_node)
        if local_cpulist:
            self.write(os.path.join(function, "local_cpulist"), local_cpulist)
        if driver:
            drivers = os.path.join("bus", "pci", "drivers", driver)
            for attr in ("bind", "unbind"):
                if os.path.join(drivers, attr) not in self._written and not os.path.exists(self.path(drivers, attr)):
                    self.write(os.path.join(drivers, attr), "")
            self.link(os.path.join(function, "driver"), drivers)
        self.link(os.path.join("bus", "pci", "devices", address), function)
        return function

    def rdma_device(
        self,
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
        """One RDMA device (EFA by default) below its PCI function; returns its directory (relative).

        ``port_counters`` go to ``ports/<port>/hw_counters/`` and ``device_counters`` to ``hw_counters/``;
        ``None`` leaves that directory out (as in a non-init network namespace). ``extra_port_dirs`` adds
        other per-port directories (a PMA ``counters/``). ``lifespan`` is the driver's cache setting file.
        """
        domain, bus, _ = pci_address.split(":")
        device = os.path.join("devices", f"pci{domain}:{bus}", pci_address, "infiniband", name)
        port_dir = os.path.join(device, "ports", str(port))
        attributes = (pci_address, vendor, device_id, driver, numa_node, local_cpulist, node_guid, fw_ver, rate,
                      state, phys_state, link_layer, port)
        if self._attributes.get(device) != attributes:  # the same as last time: every file is as it was written
            function = self.pci_function(
                pci_address, vendor=vendor, device_id=device_id, driver=driver, numa_node=numa_node,
                local_cpulist=local_cpulist,
            )
            self.link(os.path.join(device, "device"), function)
            self.link(os.path.join("class", "infiniband", name), device)
            guid = node_guid or _guid_from_pci(pci_address)
            attrs = {"node_guid": guid, "sys_image_guid": guid, "node_type": "1: CA", "node_desc": f"{name} node",
                     "fw_ver": fw_ver}
            for attr, value in attrs.items():
                self.write(os.path.join(device, attr), value)
            port_attrs = {"state": state, "phys_state": phys_state, "rate": rate, "link_layer": link_layer,
                          "lid": "0x0", "sm_lid": "0x0", "cap_mask": "0x00010000"}
            for attr, value in port_attrs.items():
                self.write(os.path.join(port_dir, attr), value)
            self._attributes[device] = attributes
        if port_counters is not None:
            self._counters(os.path.join(port_dir, "hw_counters"), port_counters, lifespan)
        if device_counters is not None:
            self._counters(os.path.join(device, "hw_counters"), device_counters, lifespan)
        for sub, counters in (extra_port_dirs or {}).items():
            self._counters(os.path.join(port_dir, sub), counters, None)
        return device

    def remove_rdma_device(self, name: str, pci_address: str) -> None:
        """The driver unregistered the device: its class entry and its directory go (the function stays)."""
        domain, bus, _ = pci_address.split(":")
        self.remove(os.path.join("class", "infiniband", name))
        self.remove(os.path.join("devices", f"pci{domain}:{bus}", pci_address, "infiniband", name))

    def _counters(self, directory: str, counters: Mapping[str, CounterValue], lifespan: int | None) -> None:
        self.mkdir(directory)
        for name, value in counters.items():
            self.write(f"{directory}{os.sep}{name}", value)
        if lifespan is not None:
            self.write(os.path.join(directory, "lifespan"), lifespan)

    def net_interface(
        self,
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
        vendor: str = EFA_VENDOR,
        device_id: str = "0xec20",
        numa_node: int = 0,
    ) -> str:
        """One interface, ``class/net/<name>`` linking to it; returns its directory relative to the root.

        With ``pci_address`` it is a physical function's (a ``device`` link and a driver), otherwise a
        virtual interface. Statistics not in ``stats`` read 0 (the kernel always has all of them);
        ``None`` for an attribute leaves its file out.
        """
        if pci_address:
            function = self.pci_function(pci_address, vendor=vendor, device_id=device_id, driver=driver,
                                         numa_node=numa_node)
            interface = os.path.join(function, "net", name)
            self.link(os.path.join(interface, "device"), function)
        else:
            interface = os.path.join("devices", "virtual", "net", name)
        self.link(os.path.join("class", "net", name), interface)
        for stat in NETDEV_STATISTICS:
            if stat not in stats:
                self.write(os.path.join(interface, "statistics", stat), 0)
        for stat, value in stats.items():
            self.write(os.path.join(interface, "statistics", stat), value)
        attrs: dict[str, CounterValue | None] = {
            "operstate": operstate, "carrier": carrier, "carrier_changes": carrier_changes, "speed": speed,
            "mtu": mtu, "address": address, "type": ARPHRD_LOOPBACK if name == "lo" else ARPHRD_ETHER,
        }
        for attr, attr_value in attrs.items():
            if attr_value is not None:
                self.write(os.path.join(interface, attr), attr_value)
        return interface


def unplug(class_entry: str) -> None:
    """A device going away, as the kernel shows it: its class link and the directory it points to vanish."""
    if os.path.islink(class_entry):
        target = os.path.realpath(class_entry)
        os.unlink(class_entry)
        shutil.rmtree(target, ignore_errors=True)
    else:
        shutil.rmtree(class_entry, ignore_errors=True)


def _guid_from_pci(pci_address: str) -> str:
    digits = "".join(c for c in pci_address if c.isalnum())[-12:].rjust(12, "0")
    return f"0000:{digits[0:4]}:{digits[4:8]}:{digits[8:12]}"


class ProcfsTree(FileTree):
    """A procfs mount: the network counters, boot time and uptime."""

    def net_snmp(self, sections: Mapping[str, Mapping[str, CounterValue]]) -> None:
        self.write_text(os.path.join("net", "snmp"), pairs_text(sections))

    def net_netstat(self, sections: Mapping[str, Mapping[str, CounterValue]]) -> None:
        self.write_text(os.path.join("net", "netstat"), pairs_text(sections))

    def net_dev(self, interfaces: Mapping[str, Mapping[str, int]]) -> None:
        """``net/dev``: receive bytes, packets, errs, drop (dropped + missed), fifo, frame, compressed,
        multicast, then transmit bytes, packets, errs, drop, fifo, colls, carrier, compressed."""
        lines = [
            "Inter-|   Receive                                                |  Transmit",
            " face |bytes    packets errs drop fifo frame compressed multicast|"
            "bytes    packets errs drop fifo colls carrier compressed",
        ]
        for name, s in interfaces.items():
            rx = [s.get("rx_bytes", 0), s.get("rx_packets", 0), s.get("rx_errors", 0),
                  s.get("rx_dropped", 0) + s.get("rx_missed_errors", 0), s.get("rx_fifo_errors", 0),
                  s.get("rx_frame_errors", 0), s.get("rx_compressed", 0), s.get("multicast", 0)]
            tx = [s.get("tx_bytes", 0), s.get("tx_packets", 0), s.get("tx_errors", 0), s.get("tx_dropped", 0),
                  s.get("tx_fifo_errors", 0), s.get("collisions", 0), s.get("tx_carrier_errors", 0),
                  s.get("tx_compressed", 0)]
            lines.append(f"{name:>6}: " + " ".join(str(v) for v in rx + tx))
        self.write_text(os.path.join("net", "dev"), "\n".join(lines) + "\n")

    def stat(self, boot_time: float) -> None:
        """``stat`` with the boot time: kernel-log stamps (microseconds since boot) map to wall-clock time."""
        self.write_text("stat", f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {int(boot_time)}\n")

    def uptime(self, seconds: float) -> None:
        self.write_text("uptime", f"{seconds:.2f} {seconds * 150:.2f}\n")


def pairs_text(sections: Mapping[str, Mapping[str, CounterValue]]) -> str:
    """``net/snmp`` / ``net/netstat`` text: a header line and a value line per section, fields in order."""
    lines: list[str] = []
    for section, fields in sections.items():
        lines.append(f"{section}: " + " ".join(fields))
        lines.append(f"{section}: " + " ".join(str(v) for v in fields.values()))
    return "\n".join(lines) + "\n"


def kernel_sections(
    fields: Mapping[str, tuple[str, ...]], values: Mapping[str, Mapping[str, CounterValue]]
) -> dict[str, dict[str, CounterValue]]:
    """Every field of a kernel's sections (``SNMP_FIELDS``, ``NETSTAT_FIELDS``), 0 where ``values`` has none;
    fields the kernel list lacks come after its own, in the order given."""
    out: dict[str, dict[str, CounterValue]] = {}
    for section, names in fields.items():
        given = values.get(section, {})
        out[section] = {name: given.get(name, 0) for name in names}
        out[section].update({k: v for k, v in given.items() if k not in out[section]})
    for section, given in values.items():
        out.setdefault(section, dict(given))
    return out


def kmsg_record(priority: int, sequence: int, usec: int, text: str) -> str:
    """One ``/dev/kmsg`` record line: ``priority,sequence,microseconds,flags;message``, newlines escaped."""
    return f"{priority},{sequence},{usec},-;{text.replace(chr(10), chr(92) + 'x0a')}\n"


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
