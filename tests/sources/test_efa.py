from __future__ import annotations

import os
import shutil

import pytest

from fleetscope.sources.efa import (
    EfaDevice,
    parse_counter,
    parse_hex_id,
    parse_rate,
    parse_state,
    read_efa,
)
from fleetscope.sources.fs import Root
from fleetscope_sim.kernel_tree import EFA_PORT_NETWORK, EFA_PORT_RDMA_WRITE, SysfsTree, unplug
from tests.conftest import FIXTURES
from tests.fixtures import make_fixtures as mk


def tree(name: str) -> Root:
    return Root(os.path.join(FIXTURES, name, "sys"))


def by_name(devices: tuple[EfaDevice, ...]) -> dict[str, EfaDevice]:
    return {d.name: d for d in devices}


# -- parsers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("0", 0),
        ("12", 12),
        ("18446744073709551615", 2**64 - 1),
        ("007", 7),
    ],
)
def test_parse_counter_accepts_unsigned_decimal(text: str, value: int) -> None:
    assert parse_counter(text) == value


@pytest.mark.parametrize("text", ["N/A (no PMA)", "", "-5", "0x1f", "12 34", "1.5", "garbage"])
def test_parse_counter_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="not a counter value"):
        parse_counter(text)


@pytest.mark.parametrize(
    "text, state", [("4: ACTIVE", "ACTIVE"), ("1: DOWN", "DOWN"), ("5: LinkUp", "LinkUp")]
)
def test_parse_state(text: str, state: str) -> None:
    assert parse_state(text) == state


@pytest.mark.parametrize("text", ["ACTIVE", "x: ACTIVE", "4:", ""])
def test_parse_state_refuses_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="not a port state"):
        parse_state(text)


@pytest.mark.parametrize(
    "text, rate",
    [
        ("100 Gb/sec (4X EDR)", 12.5e9),
        ("400 Gb/sec (8X HDR)", 50e9),
        ("2.5 Gb/sec (1X SDR)", 312.5e6),
    ],
)
def test_parse_rate_gives_bytes_per_second(text: str, rate: float) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["100", "fast", "100 Mb/sec"])
def test_parse_rate_refuses_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="not a link rate"):
        parse_rate(text)


def test_parse_hex_id() -> None:
    assert parse_hex_id("0x1d0f") == 0x1D0F
    with pytest.raises(ValueError, match="not a PCI id"):
        parse_hex_id("1d0f")


# -- fixture trees -------------------------------------------------------------------------------------


def test_p5_reports_every_counter_of_all_32_devices_exactly() -> None:
    reading = read_efa(tree("p5"))
    devices = by_name(reading.devices)
    expected = mk.p5_efa_values()
    assert set(devices) == set(expected) and len(devices) == 32
    for name, (port_counters, device_counters) in expected.items():
        device = devices[name]
        assert len(device.ports) == 1 and device.ports[0].number == 1
        assert dict(device.ports[0].counters.values) == port_counters
        assert dict(device.counters.values) == device_counters
        assert device.ports[0].counters.unreadable == () and device.counters.unreadable == ()
        assert device.ports[0].counters.lifespan_ms == 12 and device.counters.lifespan_ms == 12
        assert len(port_counters) == 22 and len(device_counters) == 14


def test_p5_identity_comes_from_the_pci_function() -> None:
    devices = by_name(read_efa(tree("p5")).devices)
    for address in mk.P5_EFA_PCI_ADDRESSES:
        device = devices[mk.rdma_pci_name(address)]
        assert device.pci_address == address
        assert device.pci_device_id == "0xefa2"
        assert device.numa_node == (0 if int(address[5:7], 16) < 0x80 else 1)
        port = device.ports[0]
        assert (port.state, port.phys_state, port.rate_bytes_per_second, port.link_layer) == (
            "ACTIVE",
            "LinkUp",
            12.5e9,
            "Unknown",
        )


def test_non_efa_rdma_device_is_not_reported() -> None:
    reading = read_efa(tree("p5"))
    assert "mlx5_0" not in by_name(reading.devices)
    assert reading.rdma_devices == 33


def test_p4d_without_rdma_write_reports_zeros_not_absence() -> None:
    devices = by_name(read_efa(tree("p4d")).devices)
    assert sorted(devices) == sorted(mk.P4D_NAMES)
    for name, (port_counters, _) in mk.p4d_efa_values().items():
        values = devices[name].ports[0].counters.values
        assert dict(values) == port_counters
        assert all(values[c] == 0 for c in EFA_PORT_RDMA_WRITE)


def test_old_driver_lacks_srd_counters_and_they_stay_absent() -> None:
    devices = by_name(read_efa(tree("old-driver")).devices)
    for name, (port_counters, device_counters) in mk.old_driver_efa_values().items():
        values = devices[name].ports[0].counters.values
        assert dict(values) == port_counters
        assert not set(EFA_PORT_NETWORK) & set(values)
        assert dict(devices[name].counters.values) == device_counters
        assert "alloc_mr_err" not in devices[name].counters.values


def test_flat_layout_is_read_as_the_driver_shows_it_in_both_directories() -> None:
    (device,) = read_efa(tree("flat")).devices
    flat = mk.flat_values()
    assert device.name == "efa_0"
    assert dict(device.ports[0].counters.values) == flat == dict(device.counters.values)
    assert device.numa_node is None  # numa_node reads -1 on a single-node system


def test_malformed_files_skip_only_that_counter() -> None:
    devices = by_name(read_efa(tree("malformed")).devices)
    port_counters, device_counters = mk.malformed_values()
    device = devices["rdmap16s27"]
    port = device.ports[0].counters
    assert set(port.unreadable) == set(mk.MALFORMED_PORT_BAD)
    good = {k: v for k, v in port_counters.items() if k not in mk.MALFORMED_PORT_BAD}
    assert dict(port.values) == {**good, **mk.MALFORMED_UNKNOWN_PORT}
    assert set(device.counters.unreadable) == set(mk.MALFORMED_DEVICE_BAD)
    good_device = {k: v for k, v in device_counters.items() if k not in mk.MALFORMED_DEVICE_BAD}
    assert dict(device.counters.values) == {**good_device, **mk.MALFORMED_UNKNOWN_DEVICE}


def test_all_unreadable_and_missing_counter_directories() -> None:
    devices = by_name(read_efa(tree("malformed")).devices)
    unreadable = devices["rdmap32s27"]
    assert unreadable.ports[0].counters.present and not unreadable.ports[0].counters.values
    assert unreadable.counters.present and not unreadable.counters.values
    hidden = devices["rdmap144s27"]
    assert not hidden.counters.present and not hidden.ports[0].counters.present
    assert devices["rdmap160s27"].ports[0].state == "DOWN"


def test_unreadable_special_file_skips_that_counter(tmp_path: object) -> None:
    root = str(tmp_path)
    SysfsTree(root).rdma_device("efa_0", "0000:00:06.0", {"tx_bytes": 10, "rx_bytes": 20}, {"cmds_err": 1})
    fifo = os.path.join(root, "class", "infiniband", "efa_0", "ports", "1", "hw_counters", "rx_drops")
    os.mkfifo(fifo)  # reads as empty without blocking (non-blocking open, no writer)
    (device,) = read_efa(Root(root)).devices
    assert dict(device.ports[0].counters.values) == {"tx_bytes": 10, "rx_bytes": 20}
    assert device.ports[0].counters.unreadable == ("rx_drops",)


def test_no_infiniband_class_means_no_devices(tmp_path: object) -> None:
    reading = read_efa(Root(str(tmp_path)))
    assert reading.devices == () and reading.rdma_devices == 0 and not reading.class_present


class VanishingRoot(Root):
    """A sysfs whose device ``victim`` is unplugged as soon as its counters are first read."""

    victim: str = ""

    def read_attrs(self, *parts: str) -> dict[str, bytes | None] | None:
        if self.victim in parts and "hw_counters" in parts:
            unplug(self.path("class", "infiniband", self.victim))
        return super().read_attrs(*parts)


def test_device_vanishing_mid_read_is_left_out(tmp_path: object) -> None:
    copy = os.path.join(str(tmp_path), "sys")
    shutil.copytree(os.path.join(FIXTURES, "p4d", "sys"), copy, symlinks=True)
    root = VanishingRoot(copy)
    object.__setattr__(root, "victim", "rdmap32s27")
    reading = read_efa(root)
    assert sorted(d.name for d in reading.devices) == sorted(set(mk.P4D_NAMES) - {"rdmap32s27"})
    expected = mk.p4d_efa_values()
    for device in reading.devices:
        assert dict(device.ports[0].counters.values) == expected[device.name][0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied_skips_that_counter(tmp_path: object) -> None:
    root = str(tmp_path)
    SysfsTree(root).rdma_device("efa_0", "0000:00:06.0", {"tx_bytes": 10, "rx_bytes": 20}, {"cmds_err": 1})
    os.chmod(os.path.join(root, "class", "infiniband", "efa_0", "ports", "1", "hw_counters", "rx_bytes"), 0)
    (device,) = read_efa(Root(root)).devices
    assert dict(device.ports[0].counters.values) == {"tx_bytes": 10}
    assert device.ports[0].counters.unreadable == ("rx_bytes",)
