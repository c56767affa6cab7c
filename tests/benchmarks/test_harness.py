from __future__ import annotations

import http.server
import json
import math
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import (
    NodeShape,
    SimTree,
    cpu_share,
    gateway_body,
    metrics_text,
    node_exporter_service,
    percentile,
    push_load,
    sample_process,
    step_record,
)
from benchmarks.measure import collector_of_metrics, owner_of
from fleetscope.collectors import REGISTRY
from tests.conftest import require_binary


def test_percentile_interpolates_and_handles_edges() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert math.isnan(percentile([], 50))


def test_process_samples_count_cpu_and_memory_of_a_live_process() -> None:
    first = sample_process(os.getpid())
    total = 0
    for i in range(3_000_000):  # bounded busy work, enough for a few clock ticks
        total += i * i
    second = sample_process(os.getpid())
    assert total > 0
    assert second.cpu_seconds > first.cpu_seconds
    assert second.hwm_bytes >= second.rss_bytes > 0
    assert 0 < cpu_share(first, second) <= 1.5  # one thread: at most about one core


def test_node_shape_builds_p5_profiles_and_refuses_impossible_ones() -> None:
    profile = NodeShape("small", gpus=1, efa=4, ena=2).profile()
    assert profile.gpu_count == 1 and len(profile.gpu_bus_ids) == 1
    assert profile.efa_count == 4 and profile.efa_devices[0] == "rdmap79s0"
    assert profile.ena_interfaces == ("ens32", "ens64")
    with pytest.raises(ValueError, match="too many: a p5 has"):
        NodeShape("too many", efa=33).profile()
    with pytest.raises(ValueError, match="none: a p5 has"):
        NodeShape("none", gpus=0).profile()


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def test_sim_tree_has_the_shape_and_moves(tmp_path: Path) -> None:
    tree = SimTree(NodeShape("t", gpus=2, efa=4, ena=3), str(tmp_path / "node"))
    ib = os.path.join(tree.paths.sysfs, "class", "infiniband")
    assert sorted(os.listdir(ib)) == ["rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0"]
    counter = os.path.join(ib, "rdmap79s0", "ports", "1", "hw_counters", "tx_bytes")
    before = int(read(counter))
    tree.tick(1.0)
    assert int(read(counter)) > before
    assert len(json.loads(read(tree.paths.gpu_state))["gpus"]) == 2
    assert set(json.loads(read(tree.paths.ena_stats))) == {"ens32", "ens64", "ens96"}


def test_hard_tree_is_issue_16s_node(tmp_path: Path) -> None:
    from fleetscope.collectors.protocol import collector_class
    from fleetscope.config import load

    tree = SimTree(NodeShape("t"), str(tmp_path / "node"), hard=True)
    tree.tick(1.0)
    assert tree.efa_counters() == 32 * 36 - 2  # two of them unreadable
    config = load({"path.sysfs": tree.paths.sysfs, "path.procfs": tree.paths.procfs,
                   "collector.efa.detail": "all"}, environ={})  # every device and port counter, not node sums
    efa = collector_class(REGISTRY["efa"])(config)
    counters = [s for f in efa.collect() for s in f.samples if s.name.endswith("_total")]
    assert len(counters) == tree.efa_counters()  # the unreadable two are left out, every other one is read
    assert len({s.value for s in counters}) == len(counters)  # distinct values
    ib = os.listdir(os.path.join(tree.paths.sysfs, "class", "infiniband"))
    assert "mlx5_0" in ib and len(ib) == 33
    nets = set(os.listdir(os.path.join(tree.paths.sysfs, "class", "net")))
    assert {"docker0", "veth3c1a9f2", "eni8c3a1f2b9d0", "ens32"} <= nets


def test_node_exporter_reads_every_efa_device_after_the_shim(tmp_path: Path) -> None:
    binary = require_binary("prometheus-node-exporter")
    tree = SimTree(NodeShape("t", efa=4), str(tmp_path / "node"))
    tree.add_node_exporter_shim()
    service = node_exporter_service(binary, tree.paths.root, str(tmp_path))
    try:
        service.start(240)  # a hang guard: it binds port 0 and logs the address it bound
        text = metrics_text(service.port)
    finally:
        service.stop()
    devices = {s.labels["device"] for f in text_string_to_metric_families(text) if f.name == "node_infiniband_info"
               for s in f.samples}
    assert devices == {"rdmap79s0", "rdmap80s0", "rdmap81s0", "rdmap82s0"}
    assert 'node_scrape_collector_success{collector="netdev"} 1' in text


def test_gateway_body_is_valid_exposition_with_the_records_values() -> None:
    record = step_record("job", 3, 17, 8)
    families = {f.name: f for f in text_string_to_metric_families(gateway_body(record).decode())}
    assert len(families) == 9
    assert families["training_step"].samples[0].value == 17
    assert families["training_tokens"].samples[0].value == record["tokens"]


class _Counter(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, str, int]]] = []

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        count = len(json.loads(body)) if self.command == "POST" and body.startswith(b"[") else 1
        self.seen.append((self.command, self.path, count))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = _answer  # noqa: N815 - http.server dispatches on do_<METHOD>

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def counting_server() -> Iterator[tuple[int, list[tuple[str, str, int]]]]:
    seen: list[tuple[str, str, int]] = []
    handler = type("Handler", (_Counter,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_push_load_counts_what_the_server_received(counting_server: tuple[int, list]) -> None:
    port, seen = counting_server
    batched = push_load(port, ranks=3, mode="post", batch=4, max_requests_per_rank=5, max_seconds=30)
    assert batched.requests == 15 and batched.errors == 0
    assert batched.records == 60 == sum(count for method, _, count in seen if method == "POST")
    seen.clear()
    per_record = push_load(port, ranks=2, mode="put", batch=1, max_requests_per_rank=3, max_seconds=30)
    assert per_record.records == 6 == len(seen)
    assert {path for _, path, _ in seen} == {"/metrics/job/bench/rank/0", "/metrics/job/bench/rank/1"}


def test_series_map_to_the_collector_whose_table_declares_them() -> None:
    owners = collector_of_metrics()
    assert owner_of("fleetscope_efa_tx_bytes_total", owners) == "efa"
    assert owner_of("fleetscope_net_up", owners) == "netdev"
    assert owner_of("fleetscope_training_steps_total", owners) == "steps"
    assert owner_of("fleetscope_collector_success", owners) == "engine"
    assert owner_of("training_loss", owners) == "pushed groups"  # a Pushgateway-style family
    assert owner_of("fleetscope_not_a_metric", owners) == "unmapped"


def test_a_benchmark_daemon_binds_port_0_and_says_what_it_bound(tmp_path: Path) -> None:
    """No port is chosen before the daemon binds one (a probed port can be taken in between): the shared
    harness reads back what the daemon bound from its ready file."""
    from benchmarks.harness import HOST, Services, daemon_service, http_get

    tree = SimTree(NodeShape("t", gpus=1, efa=4), str(tmp_path / "node"))
    daemon = daemon_service("daemon", tree.paths.root, str(tmp_path), ("netdev", "steps"))
    assert f"{HOST}:0" in daemon.argv
    with Services() as services:
        services.start(daemon)
        assert daemon.port > 0 and daemon.url == f"http://{HOST}:{daemon.port}"
        assert http_get(daemon.port, "/readyz")[0] == 200
    assert not daemon.running()  # stopped by the block, by its pid
