from __future__ import annotations

import os

import pytest

from fleetscope.check.run import EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNKNOWN, run_check
from fleetscope.collectors.efa import EfaCollector, efa_families, efa_findings, in_own_scope
from fleetscope.config import Config, load
from fleetscope.errors import NoHardware
from fleetscope.metrics import efa
from fleetscope.sources.efa import CounterSet, EfaDevice, EfaPort, EfaReading, read_efa
from fleetscope.sources.fs import Root
from fleetscope_sim.kernel_tree import SysfsTree
from tests.collectors.helpers import registry_of
from tests.conftest import FIXTURES
from tests.fixtures import make_fixtures as mk


def device(
    name: str = "efa_0",
    port_values: dict | None = None,
    device_values: dict | None = None,
    state: str | None = "ACTIVE",
    port_present: bool = True,
    device_present: bool = True,
    unreadable: tuple[str, ...] = (),
) -> EfaDevice:
    port = EfaPort(
        1,
        state,
        "LinkUp",
        12.5e9,
        "Unknown",
        CounterSet(port_present, port_values or {}, unreadable, 12 if port_present else None),
    )
    return EfaDevice(
        name,
        "0000:00:06.0",
        "0xefa0",
        0,
        "0000:0000:0000:0060",
        "",
        CounterSet(device_present, device_values or {}, (), 10 if device_present else None),
        (port,),
    )


def config_for(tree: str, settings: dict[str, object] | None = None) -> Config:
    flags: dict[str, object] = {
        "path.sysfs": os.path.join(FIXTURES, tree, "sys"),
        "path.procfs": os.path.join(FIXTURES, tree, "proc"),
    }
    return load({**flags, **(settings or {})}, environ={})


# -- mapping ---------------------------------------------------------------------------------------


def test_known_counters_get_curated_names_and_labels() -> None:
    reading = EfaReading(
        (
            device(
                port_values={"tx_bytes": 5, "rx_drops": 3, "retrans_timeout_events": 2},
                device_values={"cmds_err": 4, "create_qp_err": 6, "keep_alive_rcvd": 99},
            ),
        ),
        1,
        True,
    )
    registry = registry_of(efa_families(reading))
    port = {"device": "efa_0", "port": "1"}
    assert registry.get_sample_value("fleetscope_efa_tx_bytes_total", port) == 5
    assert registry.get_sample_value("fleetscope_efa_rx_drops_total", port) == 3
    assert registry.get_sample_value("fleetscope_efa_retransmit_timeout_events_total", port) == 2
    assert registry.get_sample_value("fleetscope_efa_admin_command_errors_total", {"device": "efa_0"}) == 4
    assert registry.get_sample_value("fleetscope_efa_keep_alive_events_total", {"device": "efa_0"}) == 99
    assert (
        registry.get_sample_value(
            "fleetscope_efa_verbs_errors_total", {"device": "efa_0", "operation": "create_qp"}
        )
        == 6
    )
    assert registry.get_sample_value("fleetscope_efa_devices") == 1
    assert registry.get_sample_value("fleetscope_efa_port_rate_bytes_per_second", port) == 12.5e9


def test_unknown_counters_are_exported_generically() -> None:
    reading = EfaReading(
        (device(port_values={"rx_ooo_pkts": 7}, device_values={"query_device_err": 1}),), 1, True
    )
    registry = registry_of(efa_families(reading))
    assert (
        registry.get_sample_value(
            "fleetscope_efa_port_hw_stat_total", {"device": "efa_0", "port": "1", "counter": "rx_ooo_pkts"}
        )
        == 7
    )
    assert (
        registry.get_sample_value(
            "fleetscope_efa_device_hw_stat_total", {"device": "efa_0", "counter": "query_device_err"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "fleetscope_efa_verbs_errors_total", {"device": "efa_0", "operation": "query_device"}
        )
        is None
    )


def test_absent_counters_stay_absent_and_lifespan_is_not_exported() -> None:
    reading = EfaReading((device(port_values={"tx_bytes": 1}),), 1, True)
    metrics = efa_families(reading)
    registry = registry_of(metrics)
    assert (
        registry.get_sample_value("fleetscope_efa_retransmit_bytes_total", {"device": "efa_0", "port": "1"})
        is None
    )
    assert "fleetscope_efa_retransmit_bytes" not in {m.name for m in metrics}
    # lifespan is the driver's cache setting, identical on every port: neither a counter nor worth
    # 64 series per p5 node.
    assert not any("lifespan" in m.name for m in metrics)
    assert not any("lifespan" in s.labels.get("counter", "") for m in metrics for s in m.samples)


def test_expected_devices_only_when_configured() -> None:
    reading = EfaReading((device(),), 1, True)
    assert registry_of(efa_families(reading)).get_sample_value("fleetscope_efa_expected_devices") is None
    assert registry_of(efa_families(reading, 32)).get_sample_value("fleetscope_efa_expected_devices") == 32


def test_info_carries_identity_labels() -> None:
    registry = registry_of(efa_families(EfaReading((device(),), 1, True)))
    labels = {
        "device": "efa_0",
        "pci_address": "0000:00:06.0",
        "pci_device_id": "0xefa0",
        "numa_node": "0",
        "node_guid": "0000:0000:0000:0060",
        "fw_version": "",
        "link_layer": "Unknown",
    }
    assert registry.get_sample_value("fleetscope_efa_info", labels) == 1


def test_every_exported_name_is_in_the_table() -> None:
    metrics = efa_families(
        EfaReading((device(port_values={"tx_bytes": 1, "zz": 2}, device_values={"mmap_err": 3}),), 1, True), 4
    )
    declared = {spec.name for spec in efa.TABLE}
    for metric in metrics:
        for sample in metric.samples:
            assert sample.name in declared


# -- the collector on fixture trees ------------------------------------------------------------------


def test_p5_collector_at_detail_all_exports_every_device_and_nothing_for_mlx5() -> None:
    settings = {"efa.expected-count": 32, "collector.efa.detail": "all"}
    registry = registry_of(EfaCollector(config_for("p5", settings)).collect())
    assert registry.get_sample_value("fleetscope_efa_devices") == 32
    assert registry.get_sample_value("fleetscope_efa_expected_devices") == 32
    for name, (port_counters, device_counters) in mk.p5_efa_values().items():
        for raw, value in port_counters.items():
            assert registry.get_sample_value(efa.TABLE[raw].name, {"device": name, "port": "1"}) == value, raw
        for raw, value in device_counters.items():
            labels = {"device": name}
            if raw.endswith("_err") and raw != "cmds_err":
                labels["operation"] = raw.removesuffix("_err")
            assert registry.get_sample_value(efa.TABLE[raw].name, labels) == value, raw
    for metric in registry.collect():
        assert all(sample.labels.get("device") != "mlx5_0" for sample in metric.samples)


def test_no_efa_is_no_hardware(tmp_path: object) -> None:
    config = load({"path.sysfs": str(tmp_path)}, environ={})
    with pytest.raises(NoHardware):
        EfaCollector(config).collect()


def test_no_efa_with_an_expected_count_exports_zero_devices(tmp_path: object) -> None:
    config = load({"path.sysfs": str(tmp_path), "efa.expected-count": "4"}, environ={})
    registry = registry_of(EfaCollector(config).collect())
    assert registry.get_sample_value("fleetscope_efa_devices") == 0
    assert registry.get_sample_value("fleetscope_efa_expected_devices") == 4


# -- health -----------------------------------------------------------------------------------------


def test_findings_from_hand_built_readings() -> None:
    assert efa_findings(EfaReading((device(port_values={"tx_bytes": 1}),), 1, True), 1) == []
    missing = efa_findings(EfaReading((device(port_values={"tx_bytes": 1}),), 1, True), 4)
    assert [(f.severity, f.subject) for f in missing] == [("unhealthy", "node")]
    assert "1 EFA devices found, 4 expected" in missing[0].message
    down = efa_findings(EfaReading((device(port_values={"tx_bytes": 1}, state="DOWN"),), 1, True))
    assert [(f.severity, f.message) for f in down] == [("unhealthy", "port 1 is DOWN, not ACTIVE")]
    unreadable = efa_findings(EfaReading((device(unreadable=("tx_bytes", "rx_bytes")),), 1, True))
    assert [(f.severity, f.message) for f in unreadable] == [
        ("unhealthy", "none of its 2 counters could be read")
    ]
    hidden = efa_findings(EfaReading((device(port_present=False, device_present=False),), 1, True))
    assert [f.severity for f in hidden] == ["unknown"]


def test_health_of_fixture_trees() -> None:
    assert EfaCollector(config_for("p5", {"efa.expected-count": 32})).health() == []
    short = EfaCollector(config_for("p4d", {"efa.expected-count": 32})).health()
    assert [f.line() for f in short] == ["UNHEALTHY efa: node: 4 EFA devices found, 32 expected"]
    lines = sorted(f.line() for f in EfaCollector(config_for("malformed")).health())
    assert lines == sorted(
        [
            "UNHEALTHY efa: efa rdmap32s27: none of its 36 counters could be read",
            "UNKNOWN efa: efa rdmap144s27: no hw_counters directory"
            " (is fleetscope running in the host network namespace?)",
            "UNHEALTHY efa: efa rdmap160s27: port 1 is DOWN, not ACTIVE",
        ]
    )


@pytest.mark.parametrize(
    "tree, expected_count, code",
    [
        ("p5", 32, EXIT_HEALTHY),
        ("p4d", 4, EXIT_HEALTHY),
        ("p4d", 32, EXIT_UNHEALTHY),
        ("malformed", 0, EXIT_UNHEALTHY),
    ],
)
def test_check_verdict(tree: str, expected_count: int, code: int) -> None:
    config = config_for(
        tree,
        {
            "efa.expected-count": expected_count,
            "collector.gpu": False,
            "collector.steps": False,
            "collector.ena": False,
        },
    )
    _, verdict = run_check(config, timeout=240)  # returns once the collectors answer
    assert verdict == code


def test_check_unknown_when_counters_are_hidden(tmp_path: object) -> None:
    SysfsTree(str(tmp_path)).rdma_device("efa_0", "0000:00:06.0", None, None)
    config = load(
        {
            "path.sysfs": str(tmp_path),
            "path.procfs": str(tmp_path),
            "collector.gpu": "false",
            "collector.steps": "false",
            "collector.ena": "false",
            "collector.netdev": "false",
            "collector.netstat": "false",
        },
        environ={},
    )
    _, verdict = run_check(config, timeout=240)  # returns once the collectors answer
    assert verdict == EXIT_UNKNOWN


def test_p5_collector_at_the_default_level_sums_per_node_admin_failures_too() -> None:
    registry = registry_of(EfaCollector(config_for("p5", {"efa.expected-count": 32})).collect())
    values = mk.p5_efa_values()
    assert registry.get_sample_value("fleetscope_efa_devices") == 32
    for raw in efa.PORT_COUNTERS:
        total = sum(port[raw] for port, _ in values.values())
        assert registry.get_sample_value(efa.TABLE[raw].name, {}) == total, raw
    for raw in ("cmds_err", "no_completion_cmds"):
        total = sum(device_counters[raw] for _, device_counters in values.values())
        assert registry.get_sample_value(efa.TABLE[raw].name, {}) == total, raw
    operations = {raw.removesuffix("_err") for _, device in values.values() for raw in device
                  if raw.endswith("_err") and raw != "cmds_err"}
    for operation in operations:
        total = sum(device.get(f"{operation}_err", 0) for _, device in values.values())
        assert registry.get_sample_value("fleetscope_efa_verbs_errors_total", {"operation": operation}) == total
    per_device = {sample.name for metric in registry.collect() for sample in metric.samples
                  if "device" in sample.labels}
    info_devices = {sample.labels["device"] for metric in registry.collect() for sample in metric.samples
                    if sample.name == "fleetscope_efa_info"}
    assert info_devices == set(values)
    assert per_device == {"fleetscope_efa_info"}
    series = sum(len(metric.samples) for metric in registry.collect())
    assert series == 32 + len(efa.PORT_COUNTERS) + 5 + len(operations) + 1 + 2


def test_old_driver_exports_no_srd_series_at_all() -> None:
    metrics = EfaCollector(config_for("old-driver", {"collector.efa.detail": "all"})).collect()
    names = {sample.name for metric in metrics for sample in metric.samples}
    for raw in (
        "retrans_bytes",
        "retrans_pkts",
        "retrans_timeout_events",
        "unresponsive_remote_events",
        "impaired_remote_conn_events",
    ):
        assert efa.TABLE[raw].name not in names
    assert "fleetscope_efa_rx_drops_total" in names
    registry = registry_of(metrics)
    assert (
        registry.get_sample_value(
            "fleetscope_efa_verbs_errors_total", {"device": "rdmap16s27", "operation": "alloc_mr"}
        )
        is None
    )


def test_flat_layout_keeps_each_counter_in_its_own_scope_once() -> None:
    (read,) = read_efa(Root(os.path.join(FIXTURES, "flat", "sys"))).devices
    device = in_own_scope(read)
    flat = mk.flat_values()
    port = device.ports[0].counters.values
    assert set(port) == set(flat) & efa.PORT_COUNTERS and len(port) == 13
    assert set(device.counters.values) == set(flat) & efa.DEVICE_COUNTERS and len(device.counters.values) == 12
    assert {**port, **device.counters.values} == flat


def test_split_layout_is_left_as_read() -> None:
    (read,) = read_efa(Root(os.path.join(FIXTURES, "p5", "sys"))).devices[:1]
    assert in_own_scope(read) is read


def test_flat_layout_exports_each_counter_once_in_its_scope() -> None:
    registry = registry_of(EfaCollector(config_for("flat", {"collector.efa.detail": "all"})).collect())
    flat = mk.flat_values()
    port = {"device": "efa_0", "port": "1"}
    assert registry.get_sample_value("fleetscope_efa_tx_bytes_total", port) == flat["tx_bytes"]
    assert (
        registry.get_sample_value("fleetscope_efa_admin_command_errors_total", {"device": "efa_0"})
        == flat["cmds_err"]
    )
    generic = [s for m in registry.collect() for s in m.samples if s.name.endswith("_hw_stat_total")]
    assert generic == []  # nothing doubled up as an "unknown" counter of the other scope
