"""#18 item 10: a source that yields nothing it should reports failure, for every collector.

A collector that can read part of its source serves that part (the reading is
"partial") and ``fleetscope_collector_success`` reads 0; one that can read
nothing fails. Hardware that is really absent stays "no hardware". Item 12:
one unreadable device directory or one counter out of range costs that
device or counter, never the collector.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import pytest

from fleetscope.collectors.efa import EfaCollector
from fleetscope.collectors.ena import EnaCollector
from fleetscope.collectors.gpu import GpuCollector
from fleetscope.collectors.netdev import NetdevCollector
from fleetscope.collectors.netstat import NetstatCollector
from fleetscope.config import load
from fleetscope.serve.engine import CollectorRunner
from fleetscope.sources.ethtool import EthtoolReading, InterfaceStats, UnreadableInterface
from fleetscope_sim.nvml_fake import install, load_scenario, uninstall, write_sysfs
from fleetscope_sim.nvml_fake.library import NOT_SUPPORTED
from tests.conftest import FIXTURES


def run(collector: object) -> tuple[str, dict[str, float]]:
    """One attempt through the engine: (status, {sample name with labels: value} served)."""
    runner = CollectorRunner("x", collector, interval=60, timeout=30, staleness=600)
    reading = runner.run_once()
    _, metrics, _, _ = runner.snapshot()
    return reading.status, {f"{s.name}{sorted(s.labels.items())}": s.value for m in metrics for s in m.samples}


@pytest.fixture
def p5(tmp_path: Path) -> Path:
    """A writable copy of the p5 node tree."""
    root = tmp_path / "p5"
    shutil.copytree(os.path.join(FIXTURES, "p5"), root, symlinks=True)
    return root


def served(values: dict[str, float], prefix: str) -> bool:
    return any(name.startswith(prefix) for name in values)


# -- netstat: /proc/net/snmp unreadable, empty or garbage ---------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "directory", "empty", "garbage", "other sections only"])
def test_netstat_without_its_tcp_section_is_not_a_success(p5: Path, damage: str) -> None:
    snmp = p5 / "proc" / "net" / "snmp"
    if damage == "missing":
        snmp.unlink()
    elif damage == "directory":
        snmp.unlink()
        snmp.mkdir()
    elif damage == "empty":
        snmp.write_text("")
    elif damage == "garbage":
        snmp.write_bytes(b"\x00\xff garbage\nTcp: RtoAlgorithm\nnot a pair\n")
    else:
        snmp.write_text("Ip: Forwarding\nIp: 1\nUdp: InDatagrams\nUdp: 5\n")
    status, values = run(NetstatCollector(load({"path.procfs": str(p5 / "proc")}, environ={})))
    assert status == "partial"
    assert not served(values, "fleetscope_tcp_retransmitted_segments_total")  # Tcp (net/snmp): blind
    assert served(values, "fleetscope_tcp_timeouts_total")  # TcpExt (net/netstat) still served


def test_netstat_with_neither_file_fails(p5: Path) -> None:
    for name in ("snmp", "netstat"):
        (p5 / "proc" / "net" / name).write_text("")
    status, values = run(NetstatCollector(load({"path.procfs": str(p5 / "proc")}, environ={})))
    assert status == "failed" and values == {}


def test_netstat_complete_is_ok(p5: Path) -> None:
    assert run(NetstatCollector(load({"path.procfs": str(p5 / "proc")}, environ={})))[0] == "ok"


# -- efa ------------------------------------------------------------------------------------------------


def efa(p5: Path) -> EfaCollector:
    return EfaCollector(load({"path.sysfs": str(p5 / "sys"), "collector.efa.detail": "all"}, environ={}))


def device_dir(p5: Path, name: str) -> Path:
    return Path(os.path.realpath(p5 / "sys" / "class" / "infiniband" / name))


def test_one_unreadable_efa_device_costs_that_device(p5: Path) -> None:
    ports = device_dir(p5, "rdmap79s0") / "ports"
    shutil.rmtree(ports)
    ports.symlink_to("ports")  # a symlink loop: listing it fails with ELOOP
    status, values = run(efa(p5))
    assert status == "partial"
    assert not served(values, "fleetscope_efa_tx_bytes_total[('device', 'rdmap79s0')")
    assert served(values, "fleetscope_efa_tx_bytes_total[('device', 'rdmap80s0')")
    findings = efa(p5).health()
    assert any(f.subject == "efa rdmap79s0" and "could not be read" in f.message for f in findings)


def test_efa_devices_without_any_counter_fail(p5: Path) -> None:
    for name in os.listdir(p5 / "sys" / "class" / "infiniband"):
        if name.startswith("rdmap"):
            directory = device_dir(p5, name)
            shutil.rmtree(directory / "hw_counters", ignore_errors=True)
            for port in (directory / "ports").iterdir():
                shutil.rmtree(port / "hw_counters", ignore_errors=True)
    status, _ = run(efa(p5))
    assert status == "failed"  # outside the host network namespace: devices visible, counters not


def test_an_efa_counter_out_of_range_costs_that_counter(p5: Path) -> None:
    counter = device_dir(p5, "rdmap79s0") / "ports" / "1" / "hw_counters" / "tx_bytes"
    counter.write_text("9" * 400 + "\n")  # above 1.8e308: cannot even be a float
    status, values = run(efa(p5))
    assert status == "ok"
    assert not served(values, "fleetscope_efa_tx_bytes_total[('device', 'rdmap79s0')")
    assert served(values, "fleetscope_efa_rx_bytes_total[('device', 'rdmap79s0')")


# -- netdev -----------------------------------------------------------------------------------------------


def test_netdev_interface_without_statistics_is_partial(p5: Path) -> None:
    statistics = Path(os.path.realpath(p5 / "sys" / "class" / "net" / "ens32")) / "statistics"
    shutil.rmtree(statistics)
    config = load({"path.sysfs": str(p5 / "sys"), "net.device-exclude": "^lo$"}, environ={})
    status, values = run(NetdevCollector(config))
    assert status == "partial"
    assert served(values, "fleetscope_net_receive_bytes_total")  # the other interfaces


def test_netdev_with_no_interface_at_all_fails(tmp_path: Path) -> None:
    status, _ = run(NetdevCollector(load({"path.sysfs": str(tmp_path)}, environ={})))
    assert status == "failed"


# -- ena --------------------------------------------------------------------------------------------------


def ena(reading: EthtoolReading) -> EnaCollector:
    return EnaCollector(load({}, environ={}), reader=lambda: reading)


def stats(device: str, **values: int) -> InterfaceStats:
    return InterfaceStats(device, "ena", MappingProxyType(values))


def test_ena_interface_that_refuses_is_partial() -> None:
    reading = EthtoolReading((stats("ens5", bw_in_allowance_exceeded=3),),
                             (UnreadableInterface("ens6", "ena", "EPERM"),))
    status, values = run(ena(reading))
    assert status == "partial" and served(values, "fleetscope_ena_bw_in_allowance_exceeded_total")


def test_ena_statistics_without_any_known_one_fail() -> None:
    status, _ = run(ena(EthtoolReading((stats("ens5", queue_0_tx_cnt=5),), ())))
    assert status == "failed"


# -- gpu --------------------------------------------------------------------------------------------------


@pytest.fixture
def gpu_node(tmp_path: Path) -> Callable[..., GpuCollector]:
    fakes = []

    def make(silent: int | None = None) -> GpuCollector:
        fake = load_scenario("h100_8x_healthy")
        write_sysfs(fake, str(tmp_path / "sys"))
        (tmp_path / "proc").mkdir(exist_ok=True)
        (tmp_path / "proc" / "stat").write_text("cpu 1\nbtime 1700000000\n")
        (tmp_path / "kmsg").write_text("")
        if silent is not None:  # every single-value query answers NOT_SUPPORTED for this GPU
            fake.gpu(silent).errors = {name: NOT_SUPPORTED for name in fake._functions if name.startswith("nvmlDevice")
                                       and name not in ("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetCount_v2")}
        install(fake)
        fakes.append(fake)
        return GpuCollector(load({"path.sysfs": str(tmp_path / "sys"), "path.procfs": str(tmp_path / "proc"),
                                  "path.kmsg": str(tmp_path / "kmsg"), "gpu.jobs-dir": str(tmp_path / "jobs")},
                                 environ={}))

    yield make
    for fake in fakes:
        fake.release()
    uninstall()


def test_gpu_that_nvml_answers_nothing_for_is_partial(gpu_node: Callable[..., GpuCollector]) -> None:
    collector = gpu_node(silent=4)
    try:
        status, values = run(collector)
    finally:
        collector.close()
    assert status == "partial"
    assert served(values, "fleetscope_gpu_power_watts[('gpu', '0')")


def test_gpu_all_answering_is_ok(gpu_node: Callable[..., GpuCollector]) -> None:
    collector = gpu_node()
    try:
        assert run(collector)[0] == "ok"
    finally:
        collector.close()


def test_every_collector_with_a_source_is_covered() -> None:
    """The collectors above, plus steps/http (in-memory state) and nccl (its skipped records are counted)."""
    from fleetscope.collectors import REGISTRY

    covered = {"netstat", "efa", "netdev", "ena", "gpu"}
    assert set(REGISTRY) - covered == {"steps", "http", "nccl"}


def test_a_netdev_counter_out_of_range_costs_that_counter(p5: Path) -> None:
    counter = Path(os.path.realpath(p5 / "sys" / "class" / "net" / "ens32")) / "statistics" / "rx_bytes"
    counter.write_text("9" * 400 + "\n")
    config = load({"path.sysfs": str(p5 / "sys"), "net.device-exclude": "^lo$"}, environ={})
    status, values = run(NetdevCollector(config))
    assert status == "ok"
    assert not served(values, "fleetscope_net_receive_bytes_total[('device', 'ens32')")
    assert served(values, "fleetscope_net_transmit_bytes_total[('device', 'ens32')")
