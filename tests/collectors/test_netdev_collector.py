from __future__ import annotations

import os

import pytest

from fleetscope.collectors.netdev import NetdevCollector, netdev_families, netdev_findings
from fleetscope.config import load
from fleetscope.errors import NoHardware, SourceError
from fleetscope.metrics import netdev
from fleetscope.sources.netdev import STATISTICS, NetInterface
from tests.collectors.helpers import registry_of
from tests.conftest import FIXTURES
from tests.fixtures import make_fixtures as mk


def interface(
    name: str = "ens5",
    operstate: str | None = "up",
    physical: bool = True,
    stats: dict[str, int] | None = None,
    speed: int | None = 25000,
) -> NetInterface:
    return NetInterface(
        name,
        stats if stats is not None else {"rx_bytes": 10, "rx_dropped": 2, "rx_missed_errors": 3},
        operstate,
        4,
        speed,
        9001,
        "0a:00:00:00:00:01",
        "ena" if physical else "",
        physical,
    )


def test_mapping_keeps_dropped_and_missed_apart() -> None:
    registry = registry_of(netdev_families([interface()]))
    labels = {"device": "ens5"}
    assert registry.get_sample_value("fleetscope_net_receive_bytes_total", labels) == 10
    assert registry.get_sample_value("fleetscope_net_receive_dropped_total", labels) == 2
    assert registry.get_sample_value("fleetscope_net_receive_missed_total", labels) == 3
    assert (
        registry.get_sample_value("fleetscope_net_transmit_bytes_total", labels) is None
    )  # not read: absent
    assert registry.get_sample_value("fleetscope_net_carrier_changes_total", labels) == 4
    assert registry.get_sample_value("fleetscope_net_up", labels) == 1
    assert registry.get_sample_value("fleetscope_net_speed_bytes_per_second", labels) == 25000 * 125_000
    assert registry.get_sample_value("fleetscope_net_mtu_bytes", labels) == 9001
    assert (
        registry.get_sample_value(
            "fleetscope_net_info",
            {"device": "ens5", "operstate": "up", "address": "0a:00:00:00:00:01", "driver": "ena"},
        )
        == 1
    )


def test_unknown_speed_and_state_are_absent() -> None:
    registry = registry_of(netdev_families([interface(operstate=None, speed=None)]))
    assert registry.get_sample_value("fleetscope_net_speed_bytes_per_second", {"device": "ens5"}) is None
    assert registry.get_sample_value("fleetscope_net_up", {"device": "ens5"}) is None


def test_down_interface_reads_zero_up() -> None:
    registry = registry_of(netdev_families([interface(operstate="down")]))
    assert registry.get_sample_value("fleetscope_net_up", {"device": "ens5"}) == 0


def test_findings_only_for_physical_interfaces_not_up() -> None:
    findings = netdev_findings(
        [
            interface("ens5", "down"),
            interface("ens6"),
            interface("docker0", "down", False),
            interface("ens7", "lowerlayerdown"),
        ]
    )
    assert [f.line() for f in findings] == [
        "UNHEALTHY netdev: nic ens5: physical interface is down",
        "UNHEALTHY netdev: nic ens7: physical interface is lowerlayerdown",
    ]


def test_p5_collector_exports_the_ena_interface_only() -> None:
    config = load({"path.sysfs": os.path.join(FIXTURES, "p5", "sys")}, environ={})
    registry = registry_of(NetdevCollector(config).collect())
    expected = mk.nic_values(mk.P5_NICS, "p5")["ens32"]
    for raw in (
        "rx_bytes",
        "rx_packets",
        "rx_errors",
        "rx_dropped",
        "rx_missed_errors",
        "tx_bytes",
        "tx_packets",
        "tx_errors",
        "tx_dropped",
    ):
        assert registry.get_sample_value(netdev.TABLE[raw].name, {"device": "ens32"}) == expected[raw]
    devices = {s.labels["device"] for m in registry.collect() for s in m.samples}
    assert devices == {"ens32"}
    assert NetdevCollector(config).health() == []


def test_include_pattern_from_config_reaches_the_source() -> None:
    config = load(
        {
            "path.sysfs": os.path.join(FIXTURES, "p5", "sys"),
            "net.device-include": "^(lo|docker0)$",
            "net.device-exclude": "",
        },
        environ={},
    )
    registry = registry_of(NetdevCollector(config).collect())
    assert {s.labels["device"] for m in registry.collect() for s in m.samples} == {"lo", "docker0"}
    assert NetdevCollector(config).health() == []  # docker0 is down but virtual


def test_malformed_tree_finding_and_partial_values() -> None:
    config = load({"path.sysfs": os.path.join(FIXTURES, "malformed", "sys")}, environ={})
    collector = NetdevCollector(config)
    registry = registry_of(collector.collect())
    assert registry.get_sample_value("fleetscope_net_receive_bytes_total", {"device": "ens32"}) is None
    assert registry.get_sample_value("fleetscope_net_transmit_bytes_total", {"device": "ens32"}) == 5_551_212
    assert [f.line() for f in collector.health()] == [
        "UNHEALTHY netdev: nic ens32: physical interface is down"
    ]


def test_nothing_selected_is_no_hardware(tmp_path: object) -> None:
    settings = {"path.sysfs": os.path.join(FIXTURES, "p5", "sys"), "net.device-include": "^nothing$"}
    with pytest.raises(NoHardware):
        NetdevCollector(load(settings, environ={})).collect()


def test_no_interface_at_all_is_a_failure_not_an_absence(tmp_path: object) -> None:
    """Every node has interfaces: an empty class/net means the collector is blind (#18 item 10)."""
    with pytest.raises(SourceError, match=r"--path\.sysfs"):
        NetdevCollector(load({"path.sysfs": str(tmp_path)}, environ={})).collect()


def test_every_statistic_the_reader_reads_has_a_metric() -> None:
    assert tuple(netdev.STATISTICS) == STATISTICS
