from __future__ import annotations

import os

import pytest

from fleetscope.config import NetConfig
from fleetscope.sources.fs import Root
from fleetscope.sources.netdev import STATISTICS, parse_speed, read_netdev, select_interfaces
from fleetscope_sim.kernel_tree import SysfsTree, unplug
from tests.conftest import FIXTURES
from tests.fixtures import make_fixtures as mk

DEFAULT_EXCLUDE = NetConfig().device_exclude


def p5() -> Root:
    return Root(os.path.join(FIXTURES, "p5", "sys"))


@pytest.mark.parametrize(
    "name, kept",
    [
        ("ens32", True),
        ("eth0", True),
        ("enp39s0", True),
        ("lo", False),
        ("veth3c1a9f2", False),
        ("eni8c3a1f2b9d0", False),
        ("cali12ab", False),
        ("docker0", False),
        ("cni0", False),
        ("flannel.1", False),
        ("br-5e1f", False),
        ("lxc12", False),
        ("cilium_host", False),
        ("vethfoo_ens", False),
        ("lo0", True),
    ],
)
def test_default_exclude_drops_container_side_interfaces(name: str, kept: bool) -> None:
    assert select_interfaces([name], "", DEFAULT_EXCLUDE) == ([name] if kept else [])


def test_include_and_exclude_patterns_combine() -> None:
    names = ["ens32", "ens33", "lo", "veth1"]
    assert select_interfaces(names, "^ens", "") == ["ens32", "ens33"]
    assert select_interfaces(names, "^ens", "^ens33$") == ["ens32"]
    assert select_interfaces(names, "", "") == names


@pytest.mark.parametrize(
    "raw, speed", [(None, None), (-1, None), (0, None), (4294967295, None), (100000, 100000)]
)
def test_parse_speed_treats_unknown_as_absent(raw: int | None, speed: int | None) -> None:
    assert parse_speed(raw) == speed


def test_p5_default_selection_is_the_ena_interface() -> None:
    (ens32,) = read_netdev(p5(), "", DEFAULT_EXCLUDE)
    assert ens32.name == "ens32"
    assert ens32.physical and ens32.up and ens32.driver == "ena"
    assert (ens32.speed_mbps, ens32.mtu, ens32.carrier_changes) == (100000, 9001, 2)
    assert ens32.address == "0a:3f:5c:21:7e:01"
    expected = mk.nic_values(mk.P5_NICS, "p5")["ens32"]
    assert dict(ens32.stats) == {k: expected.get(k, 0) for k in STATISTICS}
    # missed packets (NIC ring full) are kept apart from the stack's drops
    assert ens32.stats["rx_missed_errors"] == expected["rx_missed_errors"] != expected["rx_dropped"]


def test_every_interface_when_nothing_is_excluded() -> None:
    interfaces = {i.name: i for i in read_netdev(p5(), "", "")}
    assert set(interfaces) == set(mk.P5_NICS)
    expected = mk.nic_values(mk.P5_NICS, "p5")
    for name, interface in interfaces.items():
        assert interface.stats["rx_bytes"] == expected[name]["rx_bytes"]
        assert interface.physical == (mk.P5_NICS[name][0] is not None)
    assert interfaces["lo"].speed_mbps is None and interfaces["lo"].operstate == "unknown"
    assert interfaces["docker0"].driver == "" and not interfaces["docker0"].up


def test_malformed_statistic_is_absent_and_unknown_speed_is_none() -> None:
    (ens32,) = read_netdev(Root(os.path.join(FIXTURES, "malformed", "sys")), "", DEFAULT_EXCLUDE)
    assert "rx_bytes" not in ens32.stats
    assert ens32.stats["tx_bytes"] == 5_551_212
    assert ens32.speed_mbps is None and ens32.operstate == "down"


def test_missing_files_are_absent_not_zero(tmp_path: object) -> None:
    root = str(tmp_path)
    SysfsTree(root).net_interface("ens5", {"rx_bytes": 77}, speed=None, carrier_changes=None)
    os.remove(os.path.join(root, "class", "net", "ens5", "statistics", "tx_bytes"))
    os.remove(os.path.join(root, "class", "net", "ens5", "mtu"))
    (ens5,) = read_netdev(Root(root))
    assert ens5.stats["rx_bytes"] == 77 and "tx_bytes" not in ens5.stats
    assert ens5.mtu is None and ens5.speed_mbps is None and ens5.carrier_changes is None
    assert not ens5.physical


def test_no_class_net_gives_nothing(tmp_path: object) -> None:
    assert read_netdev(Root(str(tmp_path))) == ()


class VanishingRoot(Root):
    """A sysfs whose interface ``veth0`` is deleted as soon as its statistics are first read."""

    def read_int(self, *parts: str, base: int = 10) -> int:
        if "veth0" in parts:
            unplug(self.path("class", "net", "veth0"))
        return super().read_int(*parts, base=base)


def test_interface_vanishing_mid_read_is_left_out(tmp_path: object) -> None:
    root = str(tmp_path)
    sysfs = SysfsTree(root)
    sysfs.net_interface("ens5", {"rx_bytes": 1}, pci_address="0000:00:05.0", driver="ena")
    sysfs.net_interface("veth0", {"rx_bytes": 2})
    assert [i.name for i in read_netdev(VanishingRoot(root))] == ["ens5"]
