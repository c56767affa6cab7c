"""ENA collector: typed ethtool readings in, metric families out."""

from __future__ import annotations

import os
import subprocess
from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from fleetscope.collectors import REGISTRY
from fleetscope.collectors.ena import EnaCollector
from fleetscope.collectors.protocol import collector_class
from fleetscope.config import Config, load
from fleetscope.errors import Incomplete, NoHardware, SourceError
from fleetscope.metrics import ena
from fleetscope.sources.ethtool import EthtoolReading, InterfaceStats, UnreadableInterface
from tests.conftest import require_binary

# `ethtool -S` of an ENA interface with customer metrics (reference network.md §6, ens34),
# global counters as in §4.1 with a few made non-zero, plus per-queue statistics.
CURRENT_DRIVER = {
    "total_resets": 2, "reset_fail": 1, "tx_timeout": 3, "wd_expired": 1, "admin_q_pause": 0,
    "bad_tx_req_id": 0, "bad_rx_req_id": 0, "bad_rx_desc_num": 0, "missing_intr": 0,
    "suspected_poll_starvation": 0, "missing_tx_cmpl": 1, "rx_desc_malformed": 0, "tx_desc_malformed": 0,
    "invalid_state": 0, "os_netdev_wd": 1, "missing_admin_interrupt": 0, "admin_to": 0,
    "device_request_reset": 0, "missing_first_intr": 0, "suspend": 0, "resume": 0,
    "interface_down": 0, "interface_up": 1,
    "bw_in_allowance_exceeded": 3241329, "bw_out_allowance_exceeded": 530, "pps_allowance_exceeded": 784,
    "conntrack_allowance_exceeded": 0, "linklocal_allowance_exceeded": 0,
    "conntrack_allowance_available": 615471,
    "ena_srd_mode": 0, "ena_admin_q_submitted_cmd": 55, "ena_admin_q_completed_cmd": 55,
    "num_of_active_io_queues": 2, "queue_0_tx_cnt": 2005711, "queue_0_rx_bytes": 64430725908,
}

# In-tree 5.15 driver (reference §6, flatcar sample): no customer metrics, no reset counters.
OLD_DRIVER = {
    "tx_timeout": 0, "suspend": 0, "resume": 0, "wd_expired": 0, "interface_up": 1, "interface_down": 0,
    "admin_q_pause": 0, "bw_in_allowance_exceeded": 77193, "bw_out_allowance_exceeded": 8487,
    "pps_allowance_exceeded": 0, "conntrack_allowance_exceeded": 0, "linklocal_allowance_exceeded": 0,
}


def iface(device: str, stats: dict[str, int]) -> InterfaceStats:
    return InterfaceStats(device, "ena", MappingProxyType(dict(stats)))


def collector(*interfaces: InterfaceStats, unreadable: tuple[UnreadableInterface, ...] = ()) -> EnaCollector:
    reading = EthtoolReading(tuple(interfaces), unreadable)
    return EnaCollector(Config(), reader=lambda: reading)


def samples(families: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for family in families for s in family.samples
    }


def value(families: list[Metric], name: str, **labels: str) -> float | None:
    return samples(families).get((name, tuple(sorted(labels.items()))))


def test_registered_under_its_contract_name() -> None:
    assert collector_class(REGISTRY["ena"]) is EnaCollector


def test_current_driver_exports_allowances_gauge_and_reset_totals() -> None:
    families = collector(iface("ens5", CURRENT_DRIVER)).collect()
    dev = {"device": "ens5"}
    assert value(families, "fleetscope_ena_bw_in_allowance_exceeded_total", **dev) == 3241329
    assert value(families, "fleetscope_ena_bw_out_allowance_exceeded_total", **dev) == 530
    assert value(families, "fleetscope_ena_pps_allowance_exceeded_total", **dev) == 784
    assert value(families, "fleetscope_ena_conntrack_allowance_exceeded_total", **dev) == 0
    assert value(families, "fleetscope_ena_linklocal_allowance_exceeded_total", **dev) == 0
    assert value(families, "fleetscope_ena_conntrack_allowance_available", **dev) == 615471
    assert value(families, "fleetscope_ena_tx_timeouts_total", **dev) == 3
    assert value(families, "fleetscope_ena_resets_total", **dev) == 2
    assert value(families, "fleetscope_ena_reset_failures_total", **dev) == 1
    assert value(families, "fleetscope_ena_keep_alive_timeouts_total", **dev) == 1
    assert value(families, "fleetscope_ena_reset_reasons_total", device="ens5", reason="missing_tx_cmpl") == 1
    assert value(families, "fleetscope_ena_reset_reasons_total", device="ens5", reason="os_netdev_wd") == 1
    kinds = {family.name: family.type for family in families}
    assert kinds["fleetscope_ena_conntrack_allowance_available"] == "gauge"
    assert kinds["fleetscope_ena_pps_allowance_exceeded"] == "counter"


def test_only_table_statistics_are_exported() -> None:
    families = collector(iface("ens5", CURRENT_DRIVER)).collect()
    exported = {name for name, _ in samples(families)}
    assert not any("queue" in name or "srd" in name or "admin_q" in name for name in exported)
    table_names = {spec.name for spec in ena.TABLE}
    # counters expose <family>_total samples; every sample name comes from the table
    assert exported <= table_names
    reason_metric = str(ena.RESET_REASONS_TOTAL)
    reasons = {dict(labels)["reason"] for name, labels in samples(families) if name == reason_metric}
    assert reasons == set(ena.RESET_REASONS)


def test_older_driver_leaves_missing_statistics_absent_not_zero() -> None:
    families = collector(iface("eth0", OLD_DRIVER)).collect()
    names = {name for name, _ in samples(families)}
    assert "fleetscope_ena_conntrack_allowance_available" not in names
    assert "fleetscope_ena_resets_total" not in names
    assert "fleetscope_ena_reset_reasons_total" not in names
    assert value(families, "fleetscope_ena_bw_in_allowance_exceeded_total", device="eth0") == 77193
    assert value(families, "fleetscope_ena_tx_timeouts_total", device="eth0") == 0


def test_every_interface_gets_its_own_series() -> None:
    families = collector(iface("ens5", CURRENT_DRIVER), iface("ens6", OLD_DRIVER)).collect()
    assert value(families, "fleetscope_ena_bw_in_allowance_exceeded_total", device="ens5") == 3241329
    assert value(families, "fleetscope_ena_bw_in_allowance_exceeded_total", device="ens6") == 77193
    # one family per name even with several interfaces (the text format allows no second HELP/TYPE)
    names = [family.name for family in families]
    assert len(names) == len(set(names))


def test_no_ena_interface_is_no_hardware() -> None:
    with pytest.raises(NoHardware):
        collector().collect()
    with pytest.raises(NoHardware):
        collector().health()


def test_unreadable_interface_is_skipped_and_reported_unknown() -> None:
    bad = UnreadableInterface("ens6", "ena", "Operation not permitted")
    ena = collector(iface("ens5", CURRENT_DRIVER), unreadable=(bad,))
    with pytest.raises(Incomplete, match="ens6") as partial:  # served, and reported as a failure (#18 item 10)
        ena.collect()
    assert {dict(labels)["device"] for _, labels in samples(partial.value.metrics)} == {"ens5"}
    findings = ena.health()
    assert [(f.severity, f.subject) for f in findings] == [("unknown", "ena ens6")]
    assert "not permitted" in findings[0].message


def test_healthy_when_every_interface_answers() -> None:
    assert collector(iface("ens5", CURRENT_DRIVER)).health() == []


def test_all_interfaces_unreadable_is_a_failure() -> None:
    bad = UnreadableInterface("ens5", "ena", "Operation not permitted")
    with pytest.raises(SourceError, match="ens5"):
        collector(unreadable=(bad,)).collect()


def test_default_reader_finds_no_ena_in_a_tree_without_it(tmp_path: object) -> None:
    # The real socket path end to end: a virtio NIC under the configured sysfs root is not ENA.
    root = str(tmp_path)
    pci = os.path.join(root, "devices", "pci0000:00", "0000:00:03.0")
    os.makedirs(os.path.join(root, "bus", "pci", "drivers", "virtio_net"))
    os.makedirs(os.path.join(pci, "net", "eth0"))
    os.symlink(os.path.join(root, "bus", "pci", "drivers", "virtio_net"), os.path.join(pci, "driver"))
    os.symlink(pci, os.path.join(pci, "net", "eth0", "device"))
    os.makedirs(os.path.join(root, "class", "net"))
    os.symlink(os.path.join(pci, "net", "eth0"), os.path.join(root, "class", "net", "eth0"))
    ena = EnaCollector(load(flags={"path.sysfs": root}, environ={}))
    with pytest.raises(NoHardware):
        ena.collect()


class _Adapter:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def test_exposition_parses_and_passes_promtool() -> None:
    registry = CollectorRegistry()
    registry.register(_Adapter(collector(iface("ens5", CURRENT_DRIVER), iface("ens6", OLD_DRIVER)).collect()))
    text = generate_latest(registry)
    parsed = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert parsed["fleetscope_ena_conntrack_allowance_available"].samples[0].value == 615471
    promtool = require_binary("promtool")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
