from __future__ import annotations

import os

import pytest

from fleetscope.collectors.netstat import NetstatCollector, netstat_families
from fleetscope.config import load
from fleetscope.errors import SourceError
from fleetscope.metrics import netstat
from fleetscope.sources.netstat import NetstatReading
from tests.collectors.helpers import registry_of
from tests.conftest import FIXTURES
from tests.fixtures import make_fixtures as mk


def test_mapping_by_table_and_absent_fields_stay_absent() -> None:
    reading = NetstatReading(
        {("Tcp", "RetransSegs"): 12, ("TcpExt", "TCPRcvQDrop"): 3, ("Udp", "InErrors"): 5}
    )
    registry = registry_of(netstat_families(reading))
    assert registry.get_sample_value("fleetscope_tcp_retransmitted_segments_total") == 12
    assert registry.get_sample_value("fleetscope_tcp_receive_queue_drops_total") == 3
    assert registry.get_sample_value("fleetscope_tcp_out_segments_total") is None
    assert {m.name for m in netstat_families(reading)} == {
        "fleetscope_tcp_retransmitted_segments",
        "fleetscope_tcp_receive_queue_drops",
    }


def test_p5_collector_exports_each_table_field_exactly() -> None:
    registry = registry_of(
        NetstatCollector(load({"path.procfs": os.path.join(FIXTURES, "p5", "proc")}, environ={})).collect()
    )
    snmp, extended = mk.proc_values("p5")
    for key, spec in netstat.TABLE.specs.items():
        section, _, name = key.partition(".")
        assert (
            registry.get_sample_value(spec.name) == (snmp if section in snmp else extended)[section][name]
        ), key


def test_missing_procfs_fails_the_collector(tmp_path: object) -> None:
    with pytest.raises(SourceError):
        NetstatCollector(load({"path.procfs": str(tmp_path)}, environ={})).collect()
