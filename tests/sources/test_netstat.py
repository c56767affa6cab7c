from __future__ import annotations

import os

import pytest

from fleetscope.errors import SourceError
from fleetscope.metrics import netstat
from fleetscope.sources.fs import Root
from fleetscope.sources.netstat import parse_pairs, read_netstat
from tests.conftest import FIXTURES
from tests.fixtures import make_fixtures as mk


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Tcp: InSegs OutSegs\nTcp: 5 7\n", {("Tcp", "InSegs"): 5, ("Tcp", "OutSegs"): 7}),
        ("Tcp: MaxConn RetransSegs\nTcp: -1 9\n", {("Tcp", "MaxConn"): -1, ("Tcp", "RetransSegs"): 9}),
        # a field a newer kernel inserted: values still found by name
        (
            "Tcp: InSegs NewThing OutSegs\nTcp: 5 1 7\n",
            {("Tcp", "InSegs"): 5, ("Tcp", "NewThing"): 1, ("Tcp", "OutSegs"): 7},
        ),
        # header and values out of step: the section is skipped, the next one still parsed
        ("Tcp: InSegs OutSegs\nTcp: 5\nUdp: InErrors\nUdp: 3\n", {("Udp", "InErrors"): 3}),
        # a non-numeric value skips that field only
        ("TcpExt: TCPTimeouts ListenDrops\nTcpExt: x 4\n", {("TcpExt", "ListenDrops"): 4}),
        # an unpaired header: resynchronise on the next pair
        ("Ip: Forwarding\nTcp: InSegs\nTcp: 11\n", {("Tcp", "InSegs"): 11}),
        ("", {}),
        ("\n\nTcp: InErrs\n\nTcp: 2\n", {("Tcp", "InErrs"): 2}),
    ],
)
def test_parse_pairs(text: str, expected: dict[tuple[str, str], int]) -> None:
    assert parse_pairs(text) == expected


def test_p5_counters_by_name() -> None:
    reading = read_netstat(Root(os.path.join(FIXTURES, "p5", "proc")))
    snmp, extended = mk.proc_values("p5")
    for key in netstat.TABLE.specs:
        section, _, name = key.partition(".")
        written = (snmp if section in snmp else extended)[section][name]
        assert reading.get(key) == written
    assert reading.get("Tcp.MaxConn") == -1
    assert len(reading.values) == sum(len(s) for s in snmp.values()) + sum(len(s) for s in extended.values())


def test_malformed_skips_out_of_step_section_and_bad_value() -> None:
    reading = read_netstat(Root(os.path.join(FIXTURES, "malformed", "proc")))
    assert reading.get("Tcp.RetransSegs") is None  # the Tcp section is out of step
    assert reading.get("TcpExt.TCPTimeouts") is None  # "x"
    assert reading.get("TcpExt.ListenDrops") == 74
    assert reading.get("Udp.InErrors") == mk.proc_values("malformed")[0]["Udp"]["InErrors"]


def test_one_file_missing_gives_the_other(tmp_path: object) -> None:
    net = os.path.join(str(tmp_path), "net")
    os.makedirs(net)
    with open(os.path.join(net, "snmp"), "w") as handle:
        handle.write("Tcp: RetransSegs\nTcp: 8\n")
    reading = read_netstat(Root(str(tmp_path)))
    assert reading.get("Tcp.RetransSegs") == 8 and reading.get("TcpExt.TCPTimeouts") is None


def test_both_files_missing_is_a_source_error(tmp_path: object) -> None:
    with pytest.raises(SourceError):
        read_netstat(Root(str(tmp_path)))
