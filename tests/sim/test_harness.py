"""The process harness: servers bind port 0 and the harness reads back what they bound."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from fleetscope_sim.harness import Daemon, Prometheus, eventually
from fleetscope_sim.localhttp import get
from tests.conftest import FIXTURES, require_binary

P5 = os.path.join(FIXTURES, "p5")
QUIET = {"path.sysfs": os.path.join(P5, "sys"), "path.procfs": os.path.join(P5, "proc"), "collector.gpu": False,
         "collector.ena": False, "collector.nccl": False}


def test_a_daemon_on_port_0_writes_the_addresses_it_bound(tmp_path: Path) -> None:
    daemon = Daemon.serve(tmp_path, {**QUIET, "push.listen-address": "127.0.0.1:0"}).start()
    try:
        written = json.loads(daemon.ready_file.read_text())
        assert set(written) == {"main", "push"} and written == daemon.addresses
        assert daemon.port != 0 and daemon.push_url != daemon.url
        assert get(daemon.url + "/readyz", timeout=10)[0] == 200
        assert get(daemon.push_url + "/healthz", timeout=10)[0] == 200
        with socket.socket() as taken, pytest.raises(OSError, match="in use"):  # the daemon's: nobody else's
            taken.bind(("127.0.0.1", daemon.port))
        assert daemon.peak_rss() >= daemon.rss() > 10 * 1024 * 1024
    finally:
        daemon.stop()
    daemon.spawn()  # a file left by the last run names ports that are not the new daemon's
    assert not daemon.ready_file.exists()
    daemon.stop()


def test_a_daemon_that_exits_before_it_listens_fails_its_start_with_its_log(tmp_path: Path) -> None:
    daemon = Daemon.serve(tmp_path, {**QUIET, "collector.no-such": True})
    with pytest.raises(RuntimeError, match="exited with 2") as failure:
        daemon.start()
    assert "no-such" in str(failure.value)


def test_eventually_returns_the_first_truthy_value_and_times_out_with_what_it_waited_for() -> None:
    values = iter([None, 0, "", 7])
    assert eventually(lambda: next(values), timeout=5, interval=0) == 7
    with pytest.raises(TimeoutError, match="the moon"):
        eventually(lambda: False, timeout=0, what="the moon")
    with pytest.raises(ZeroDivisionError):  # a predicate that cannot be evaluated fails at once
        eventually(lambda: 1 / 0, timeout=60)


def test_prometheus_on_port_0_is_found_from_its_own_log(tmp_path: Path) -> None:
    require_binary("prometheus")
    prometheus = Prometheus(tmp_path / "prometheus").start({"global": {"scrape_interval": "1m"}})
    try:
        assert not prometheus.address.endswith(":0")
        assert prometheus.query("vector(1)")[0]["value"][1] == "1"
    finally:
        prometheus.stop()
