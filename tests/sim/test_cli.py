from __future__ import annotations

import socket

import pytest

from fleetscope.cli import main


def test_commands_are_registered(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "simulate" in out and "demo" in out


def test_a_bad_schedule_is_refused_before_anything_starts(tmp_path):
    schedule = tmp_path / "faults.yml"
    schedule.write_text("faults:\n  - {kind: xid, at: 10s, node: node-00, gpu: 1}\n")
    with pytest.raises(SystemExit, match=r"needs params\.xid"):
        main(["simulate", "--nodes", "2", "--jobs", "1", "--faults", str(schedule)])
    schedule.write_text("faults:\n  - {kind: row_remap_pending, at: 10s, node: node-09, gpu: 1}\n")
    with pytest.raises(SystemExit, match="no node node-09"):
        main(["simulate", "--nodes", "2", "--jobs", "1", "--faults", str(schedule)])


def test_demo_without_prometheus_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["demo"]) == 2
    assert "apt-get install prometheus" in capsys.readouterr().err


def test_demo_refuses_busy_ports(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--nodes", "2", "--jobs", "1", "--base-port", str(port - 1),
                     "--prometheus-port", "1"]) == 2
    err = capsys.readouterr().err
    assert "ports already in use:" in err
    # Other ports nearby may be taken by unrelated sockets too; the one held here must be named.
    assert str(port) in err.split("ports already in use:")[1].split("(")[0].replace(",", " ").split()
