"""The SIOCETHTOOL reader, against a fake kernel and, where allowed, a real veth pair in a network namespace.

The fake kernel lays out its answers with ctypes structures declared here from
include/uapi/linux/ethtool.h, independently of the struct formats in the code
under test, so a layout mistake on either side shows up as a wrong reading.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from fleetscope.sources.ethtool import (
    DEFAULT_ATTEMPTS,
    EthtoolError,
    driver_info,
    read_interfaces,
    read_stats,
    stats_count,
)
from fleetscope.sources.fs import Root

# -- kernel-side structures ---------------------------------------------------------------------------

GDRVINFO, GSTRINGS, GSTATS, GSSET_INFO = 0x03, 0x1B, 0x1D, 0x37
ETH_SS_STATS = 1


class EthtoolDrvinfo(ctypes.Structure):
    _fields_ = [
        ("cmd", ctypes.c_uint32),
        ("driver", ctypes.c_char * 32),
        ("version", ctypes.c_char * 32),
        ("fw_version", ctypes.c_char * 32),
        ("bus_info", ctypes.c_char * 32),
        ("erom_version", ctypes.c_char * 32),
        ("reserved2", ctypes.c_char * 12),
        ("n_priv_flags", ctypes.c_uint32),
        ("n_stats", ctypes.c_uint32),
        ("testinfo_len", ctypes.c_uint32),
        ("eedump_len", ctypes.c_uint32),
        ("regdump_len", ctypes.c_uint32),
    ]


class EthtoolSsetInfo(ctypes.Structure):
    _fields_ = [("cmd", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("sset_mask", ctypes.c_uint64)]


class EthtoolGstrings(ctypes.Structure):
    _fields_ = [("cmd", ctypes.c_uint32), ("string_set", ctypes.c_uint32), ("len", ctypes.c_uint32)]


class EthtoolStats(ctypes.Structure):
    _fields_ = [("cmd", ctypes.c_uint32), ("n_stats", ctypes.c_uint32)]


def test_kernel_struct_sizes_match_the_uapi_header() -> None:
    assert ctypes.sizeof(EthtoolDrvinfo) == 196
    assert ctypes.sizeof(EthtoolSsetInfo) == 16
    assert ctypes.sizeof(EthtoolGstrings) == 12
    assert ctypes.sizeof(EthtoolStats) == 8


# ENA statistics as `ethtool -S ens34` lists them (reference network.md §6, global part completed from §4.1).
ENA_SAMPLE: list[tuple[str, int]] = [
    ("total_resets", 0), ("reset_fail", 0), ("tx_timeout", 0), ("wd_expired", 0), ("admin_q_pause", 0),
    ("interface_down", 0), ("interface_up", 1),
    ("bw_in_allowance_exceeded", 3241329), ("bw_out_allowance_exceeded", 530),
    ("pps_allowance_exceeded", 784),
    ("conntrack_allowance_exceeded", 0), ("linklocal_allowance_exceeded", 0),
    ("conntrack_allowance_available", 615471),
    ("ena_srd_mode", 0), ("ena_srd_tx_pkts", 0), ("ena_srd_eligible_tx_pkts", 0), ("ena_srd_rx_pkts", 0),
    ("ena_srd_resource_utilization", 0),
    ("ena_admin_q_aborted_cmd", 0), ("ena_admin_q_submitted_cmd", 55), ("ena_admin_q_completed_cmd", 55),
]


def queue_stats(queues: int) -> list[tuple[str, int]]:
    """Per-queue ENA statistics; their number follows the queue count, which is what changes at runtime."""
    out: list[tuple[str, int]] = [("num_of_active_io_queues", queues)]
    for q in range(queues):
        out += [(f"queue_{q}_tx_cnt", 1000 + q), (f"queue_{q}_tx_bytes", 2**40 + q)]
        out.append((f"queue_{q}_rx_cnt", 7 * q))
    return out


@dataclass
class FakeDevice:
    driver: str
    stats: list[tuple[str, int]]
    version: str = "2.13.0g"
    bus_info: str = "0000:00:05.0"
    error: int | None = None  # errno every request on this device fails with
    has_sset_info: bool = True


@dataclass
class FakeKernel:
    """Answers SIOCETHTOOL requests the way net/ethtool/ioctl.c does.

    ``checks_count`` selects the kernel generation: True is the behaviour since
    "ethtool: Avoid overflowing userspace buffer on stats query" (a mismatching
    count gets 0 and no data), False the older one that writes its own count.
    Either way, a write that would not fit the caller's buffer fails the test:
    on a real kernel it would overwrite foreign memory.
    """

    devices: dict[str, FakeDevice]
    checks_count: bool = True
    after_request: Callable[[FakeKernel, str, int], None] | None = None  # runs after each answered request
    calls: list[tuple[str, int]] = field(default_factory=list)

    def __call__(self, device: str, request: bytearray) -> None:
        cmd = int.from_bytes(request[:4], sys.byteorder)
        self.calls.append((device, cmd))
        dev = self.devices.get(device)
        if dev is None:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        if dev.error is not None:
            raise OSError(dev.error, os.strerror(dev.error))
        if cmd == GDRVINFO:
            self._drvinfo(dev, request)
        elif cmd == GSSET_INFO:
            if not dev.has_sset_info:
                raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
            self._sset_info(dev, request)
        elif cmd == GSTRINGS:
            self._gstrings(dev, request)
        elif cmd == GSTATS:
            self._gstats(dev, request)
        else:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        if self.after_request is not None:
            self.after_request(self, device, cmd)

    @staticmethod
    def _fit(request: bytearray, size: int) -> None:
        if size > len(request):
            raise AssertionError(f"kernel would write {size} bytes into a {len(request)}-byte buffer")

    def _drvinfo(self, dev: FakeDevice, request: bytearray) -> None:
        self._fit(request, ctypes.sizeof(EthtoolDrvinfo))
        info = EthtoolDrvinfo.from_buffer(request)
        info.driver, info.version = dev.driver.encode(), dev.version.encode()
        info.bus_info = dev.bus_info.encode()
        info.n_stats = len(dev.stats)

    def _sset_info(self, dev: FakeDevice, request: bytearray) -> None:
        header = EthtoolSsetInfo.from_buffer(request)
        if header.sset_mask & (1 << ETH_SS_STATS):
            self._fit(request, ctypes.sizeof(EthtoolSsetInfo) + 4)
            (ctypes.c_uint32 * 1).from_buffer(request, ctypes.sizeof(EthtoolSsetInfo))[0] = len(dev.stats)
        header.sset_mask &= 1 << ETH_SS_STATS

    def _answer_count(self, asked: int, actual: int) -> int:
        if self.checks_count and asked not in (0, actual):
            return 0
        return actual

    def _gstrings(self, dev: FakeDevice, request: bytearray) -> None:
        header = EthtoolGstrings.from_buffer(request)
        assert header.string_set == ETH_SS_STATS
        count = self._answer_count(header.len, len(dev.stats))
        header.len = count
        offset = ctypes.sizeof(EthtoolGstrings)
        self._fit(request, offset + 32 * count)
        names = (ctypes.c_char * 32 * count).from_buffer(request, offset)
        for i, (name, _) in enumerate(dev.stats[:count]):
            names[i].value = name.encode()

    def _gstats(self, dev: FakeDevice, request: bytearray) -> None:
        header = EthtoolStats.from_buffer(request)
        count = self._answer_count(header.n_stats, len(dev.stats))
        header.n_stats = count
        offset = ctypes.sizeof(EthtoolStats)
        self._fit(request, offset + 8 * count)
        values = (ctypes.c_uint64 * count).from_buffer(request, offset)
        for i, (_, value) in enumerate(dev.stats[:count]):
            values[i] = value

    def commands(self, device: str) -> list[int]:
        return [cmd for dev, cmd in self.calls if dev == device]


def ena_kernel(**kwargs: object) -> FakeKernel:
    return FakeKernel({"ens5": FakeDevice("ena", ENA_SAMPLE + queue_stats(4))}, **kwargs)  # type: ignore[arg-type]


# -- single-interface reads against the fake ----------------------------------------------------------


def test_reads_ena_names_and_values_in_driver_order() -> None:
    kernel = ena_kernel()
    stats = read_stats(kernel, "ens5")
    expected = ENA_SAMPLE + queue_stats(4)
    assert list(stats.items()) == expected
    assert stats["bw_in_allowance_exceeded"] == 3241329
    assert stats["queue_2_tx_bytes"] == 2**40 + 2  # full u64 width survives
    assert kernel.commands("ens5") == [GSSET_INFO, GSTRINGS, GSTATS]


def test_driver_info_fields() -> None:
    info = driver_info(ena_kernel(), "ens5")
    assert (info.driver, info.version, info.bus_info) == ("ena", "2.13.0g", "0000:00:05.0")
    assert info.n_stats == len(ENA_SAMPLE) + len(queue_stats(4))


def test_driver_without_sset_info_falls_back_to_drvinfo_count() -> None:
    kernel = FakeKernel({"eth0": FakeDevice("ena", ENA_SAMPLE, has_sset_info=False)})
    assert stats_count(kernel, "eth0") == len(ENA_SAMPLE)
    assert read_stats(kernel, "eth0") == dict(ENA_SAMPLE)


def test_device_without_statistics_gives_empty_mapping() -> None:
    kernel = FakeKernel({"eth0": FakeDevice("ena", [])})
    assert read_stats(kernel, "eth0") == {}
    assert kernel.commands("eth0") == [GSSET_INFO]


def test_repeated_name_keeps_its_first_value() -> None:
    repeated = [("tx_timeout", 3), ("tx_timeout", 9), ("wd_expired", 1)]
    kernel = FakeKernel({"eth0": FakeDevice("ena", repeated)})
    assert read_stats(kernel, "eth0") == {"tx_timeout": 3, "wd_expired": 1}


Hook = Callable[[FakeKernel, str, int], None]


def reconfigure_after(step: int, device: str, new_stats: list[tuple[str, int]]) -> Hook:
    """A hook that swaps the device's statistics right after its ``step``-th request (1-based)."""

    def hook(kernel: FakeKernel, dev: str, cmd: int) -> None:
        if dev == device and len(kernel.commands(device)) == step:
            kernel.devices[device].stats = new_stats

    return hook


@pytest.mark.parametrize("checks_count", [True, False], ids=["kernel-checks-count", "legacy-kernel"])
@pytest.mark.parametrize("step", [1, 2], ids=["between-count-and-names", "between-names-and-values"])
def test_count_growing_between_ioctls_is_retried(checks_count: bool, step: int) -> None:
    grown = ENA_SAMPLE + queue_stats(8)  # queues reconfigured from 4 to 8
    kernel = ena_kernel(checks_count=checks_count, after_request=reconfigure_after(step, "ens5", grown))
    stats = read_stats(kernel, "ens5")
    assert list(stats.items()) == grown
    # the inconsistent pass is abandoned and one full pass follows
    assert kernel.commands("ens5")[step + 1:] == [GSSET_INFO, GSTRINGS, GSTATS]


@pytest.mark.parametrize("checks_count", [True, False], ids=["kernel-checks-count", "legacy-kernel"])
def test_count_shrinking_between_ioctls_never_mixes_names_and_values(checks_count: bool) -> None:
    shrunk = [(name, value + 1) for name, value in ENA_SAMPLE + queue_stats(1)]
    kernel = ena_kernel(checks_count=checks_count, after_request=reconfigure_after(2, "ens5", shrunk))
    stats = read_stats(kernel, "ens5")
    assert list(stats.items()) == shrunk
    assert "queue_3_tx_cnt" not in stats


def test_count_larger_than_the_buffer_is_refused_and_retried() -> None:
    # A jump far beyond any headroom: the kernel must answer with no data, and the reader
    # must neither read past its buffer nor accept the truncated answer.
    huge = ENA_SAMPLE + queue_stats(400)
    kernel = ena_kernel(checks_count=True, after_request=reconfigure_after(1, "ens5", huge))
    stats = read_stats(kernel, "ens5")
    assert len(stats) == len(huge)
    assert stats["queue_399_tx_cnt"] == 1399


def test_count_that_never_settles_gives_up_after_bounded_attempts() -> None:
    flip = {"queues": 4}

    def keep_changing(kernel: FakeKernel, device: str, cmd: int) -> None:
        if cmd == GSSET_INFO:
            flip["queues"] = 6 if flip["queues"] == 4 else 4
            kernel.devices[device].stats = ENA_SAMPLE + queue_stats(flip["queues"])

    kernel = ena_kernel(after_request=keep_changing)
    with pytest.raises(EthtoolError, match="kept changing"):
        read_stats(kernel, "ens5", attempts=3)
    assert kernel.commands("ens5").count(GSSET_INFO) == 3
    assert DEFAULT_ATTEMPTS >= 2


def test_permission_error_carries_errno() -> None:
    kernel = FakeKernel({"ens5": FakeDevice("ena", ENA_SAMPLE, error=errno.EPERM)})
    with pytest.raises(EthtoolError) as caught:
        read_stats(kernel, "ens5")
    assert caught.value.errno == errno.EPERM and caught.value.device == "ens5"


# -- interfaces under a sysfs root --------------------------------------------------------------------


def make_netdev(sysfs: str, name: str, driver: str | None, bus: str = "") -> None:
    """class/net/<name>, with device/driver symlinks like a PCI NIC when ``driver`` is given."""
    os.makedirs(os.path.join(sysfs, "class", "net"), exist_ok=True)
    netdir = os.path.join(sysfs, "devices", "virtual", "net", name)
    if driver is not None:
        pci = os.path.join(sysfs, "devices", "pci0000:00", bus)
        netdir = os.path.join(pci, "net", name)
        drvdir = os.path.join(sysfs, "bus", "pci", "drivers", driver)
        os.makedirs(drvdir, exist_ok=True)
        os.makedirs(netdir, exist_ok=True)
        os.symlink(os.path.relpath(drvdir, pci), os.path.join(pci, "driver"))
        os.symlink(os.path.relpath(pci, netdir), os.path.join(netdir, "device"))
    os.makedirs(netdir, exist_ok=True)
    class_net = os.path.join(sysfs, "class", "net")
    os.symlink(os.path.relpath(netdir, class_net), os.path.join(class_net, name))


@pytest.fixture
def node_sysfs(tmp_path: object) -> str:
    sysfs = str(tmp_path)
    make_netdev(sysfs, "ens5", "ena", "0000:00:05.0")
    make_netdev(sysfs, "ens6", "ena", "0000:00:06.0")
    make_netdev(sysfs, "ens7", "virtio_net", "0000:00:07.0")
    make_netdev(sysfs, "lo", None)
    make_netdev(sysfs, "veth1a2b", None)
    return sysfs


def node_kernel(**devices: FakeDevice) -> FakeKernel:
    base = {
        "ens5": FakeDevice("ena", ENA_SAMPLE + queue_stats(2)),
        "ens6": FakeDevice("ena", ENA_SAMPLE + queue_stats(2), bus_info="0000:00:06.0"),
        "ens7": FakeDevice("virtio_net", [("rx_queue_0_packets", 5)]),
        "lo": FakeDevice("", [], has_sset_info=False),
        "veth1a2b": FakeDevice("veth", [("peer_ifindex", 9)]),
    }
    base.update(devices)
    return FakeKernel(base)


def test_keeps_interfaces_by_driver_not_by_name(node_sysfs: str) -> None:
    kernel = node_kernel()
    reading = read_interfaces(Root(node_sysfs), kernel, {"ena"})
    assert [(i.device, i.driver) for i in reading.interfaces] == [("ens5", "ena"), ("ens6", "ena")]
    assert reading.interfaces[1].get("pps_allowance_exceeded") == 784
    assert reading.unreadable == ()
    # a PCI NIC's driver comes from sysfs: no ioctl is spent on the virtio interface
    assert kernel.commands("ens7") == []


def test_virtual_interface_driver_comes_from_drvinfo(node_sysfs: str) -> None:
    kernel = node_kernel()
    reading = read_interfaces(Root(node_sysfs), kernel, {"veth"})
    assert [(i.device, dict(i.stats)) for i in reading.interfaces] == [("veth1a2b", {"peer_ifindex": 9})]
    assert kernel.commands("lo") == [GDRVINFO]


def test_include_and_exclude_patterns(node_sysfs: str) -> None:
    kernel = node_kernel()
    only6 = read_interfaces(Root(node_sysfs), kernel, {"ena"}, include="^ens6$")
    assert [i.device for i in only6.interfaces] == ["ens6"]
    not5 = read_interfaces(Root(node_sysfs), kernel, {"ena"}, exclude="^ens5$")
    assert [i.device for i in not5.interfaces] == ["ens6"]
    # excluded interfaces are never asked anything
    assert kernel.commands("ens5") == []


def test_permission_error_skips_only_that_interface(node_sysfs: str) -> None:
    kernel = node_kernel(ens5=FakeDevice("ena", ENA_SAMPLE, error=errno.EPERM))
    reading = read_interfaces(Root(node_sysfs), kernel, {"ena"})
    assert [i.device for i in reading.interfaces] == ["ens6"]
    assert [(u.device, u.driver) for u in reading.unreadable] == [("ens5", "ena")]
    assert "not permitted" in reading.unreadable[0].reason.lower()
    assert reading.found == 2


def test_interface_vanishing_mid_read_is_dropped(node_sysfs: str) -> None:
    kernel = node_kernel()
    del kernel.devices["ens6"]  # listed in sysfs, gone from the kernel: ENODEV
    reading = read_interfaces(Root(node_sysfs), kernel, {"ena"})
    assert [i.device for i in reading.interfaces] == ["ens5"]
    assert reading.unreadable == ()


def test_missing_class_net_means_no_interfaces(tmp_path: object) -> None:
    reading = read_interfaces(Root(str(tmp_path)), FakeKernel({}), {"ena"})
    assert reading.found == 0


# -- the real kernel: a veth pair in a fresh network namespace ----------------------------------------

VETH_A, VETH_B = "vethfsa", "vethfsb"

# Runs inside the namespace: reads both ends with the real ioctl and prints JSON. With
# RECONFIGURE set, the channel count of VETH_A is changed through ETHTOOL_SCHANNELS right
# after the first GSSET_INFO, so the next request meets a different count.
NETNS_SCRIPT = r"""
import json, os, struct, sys
from fleetscope.sources.ethtool import SocketIoctl, driver_info, read_interfaces
from fleetscope.sources.fs import Root

reconfigure = int(os.environ.get("RECONFIGURE", "0"))
calls = []
with SocketIoctl() as real:
    def ioctl(device, request):
        cmd = struct.unpack_from("=I", request)[0]
        real(device, request)
        calls.append([device, cmd])
        first_count_query = cmd == 0x37 and calls.count([device, 0x37]) == 1
        if reconfigure and device == sys.argv[1] and first_count_query:
            channels = bytearray(36)
            struct.pack_into("=I", channels, 0, 0x3c)
            real(device, channels)
            struct.pack_into("=I", channels, 0, 0x3d)
            struct.pack_into("=II", channels, 20, reconfigure, reconfigure)
            real(device, channels)
    reading = read_interfaces(Root("/sys"), ioctl, {"veth"}, exclude="")
    drvinfo = {d: driver_info(real, d).n_stats for d in (sys.argv[1], sys.argv[2])}
print(json.dumps({
    "interfaces": {i.device: dict(i.stats) for i in reading.interfaces},
    "unreadable": [u.device for u in reading.unreadable],
    "n_stats": drvinfo,
    "calls": calls,
}))
"""


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    ip = shutil.which("ip")
    if ip is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 to create a network namespace")
    name = f"fsethtool-{uuid.uuid4().hex[:8]}"
    made = subprocess.run([ip, "netns", "add", name], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"network namespaces not permitted here: {made.stderr.strip()}")
    try:
        link = subprocess.run(
            [ip, "netns", "exec", name, ip, "link", "add", VETH_A, "numrxqueues", "4", "numtxqueues", "4",
             "type", "veth", "peer", "name", VETH_B, "numrxqueues", "4", "numtxqueues", "4"],
            capture_output=True, text=True, check=False,
        )
        if link.returncode != 0:
            pytest.skip(f"cannot create a veth pair: {link.stderr.strip()}")
        yield name
    finally:
        subprocess.run([ip, "netns", "del", name], capture_output=True, check=False)


def in_netns(ns: str, *argv: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})}, check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def read_in_netns(ns: str, reconfigure: int = 0) -> dict:
    env = {"RECONFIGURE": str(reconfigure)}
    out = in_netns(ns, sys.executable, "-c", NETNS_SCRIPT, VETH_A, VETH_B, env=env)
    return json.loads(out)


def rx_queues(ns: str, device: str) -> int:
    listing = in_netns(ns, "ls", f"/sys/class/net/{device}/queues")
    return sum(1 for entry in listing.split() if entry.startswith("rx-"))


def test_real_veth_statistics_match_the_kernel(netns: str) -> None:
    result = read_in_netns(netns)
    assert set(result["interfaces"]) == {VETH_A, VETH_B}  # lo has no driver statistics
    for device, peer in ((VETH_A, VETH_B), (VETH_B, VETH_A)):
        stats = result["interfaces"][device]
        # the count from GSSET_INFO agrees with GDRVINFO's n_stats
        assert len(stats) == result["n_stats"][device]
        # peer_ifindex is the other end's ifindex as the kernel shows it in sysfs
        assert stats["peer_ifindex"] == int(in_netns(netns, "cat", f"/sys/class/net/{peer}/ifindex"))
        # one set of per-queue statistics per active receive queue
        queues = rx_queues(netns, device)
        assert sorted(n for n in stats if n.endswith("_xdp_packets")) == sorted(
            f"rx_queue_{q}_xdp_packets" for q in range(queues)
        )


def test_real_channel_change_between_ioctls_is_retried(netns: str) -> None:
    before = read_in_netns(netns)["interfaces"][VETH_A]
    result = read_in_netns(netns, reconfigure=2)
    stats = result["interfaces"][VETH_A]
    a_calls = [cmd for device, cmd in result["calls"] if device == VETH_A]
    assert a_calls.count(GSSET_INFO) == 2, a_calls  # the first pass met a changed count
    assert len(stats) < len(before)
    assert rx_queues(netns, VETH_A) == 2
    per_queue = sorted(n for n in stats if n.endswith("_xdp_packets"))
    assert per_queue == ["rx_queue_0_xdp_packets", "rx_queue_1_xdp_packets"]
    assert len(stats) == result["n_stats"][VETH_A]
