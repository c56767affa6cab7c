"""The simulated cluster through the real daemon processes (no Prometheus)."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetscope.sim.cluster import SimCluster, make_cluster
from fleetscope.sim.faults import parse_schedule
from tests.conftest import free_port_run


def _samples(url: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


@pytest.mark.slow
def test_nodes_serve_moving_metrics_and_pushed_steps(scratch):
    faults = parse_schedule([
        {"kind": "efa_device_missing", "at": 0, "node": "node-01", "device": "rdmap32s27"},
        {"kind": "rank_dies", "at": 0, "job": "job-a", "rank": 13},
    ])
    spec = make_cluster(nodes=2, jobs=1, base_port=free_port_run(2), faults=faults, step_seconds=1.0,
                        collector_interval=1.0)
    cluster = SimCluster(spec, str(scratch))
    cluster.start()
    try:
        cluster.run_in_thread()
        time.sleep(4)
        first = _samples(cluster.url("node-00"))
        time.sleep(4)
        second = _samples(cluster.url("node-00"))
        p4d = _samples(cluster.url("node-01"))
    finally:
        cluster.stop()

    def total(samples, name):
        return sum(s.value for s in samples[name])

    assert total(second, "fleetscope_efa_tx_bytes_total") > total(first, "fleetscope_efa_tx_bytes_total") > 0
    assert total(second, "fleetscope_tcp_out_segments_total") > total(first, "fleetscope_tcp_out_segments_total")
    # node-00 is a p5 (32 EFA devices), node-01 a p4d that lost one of its 4.
    assert second["fleetscope_efa_devices"][0].value == 32
    assert p4d["fleetscope_efa_devices"][0].value == 3 and p4d["fleetscope_efa_expected_devices"][0].value == 4
    # Ranks 0-7 run on node-00 and push there; rank 13 (node-01) died at once and never pushed.
    ranks = {s.labels["rank"] for s in second["fleetscope_training_steps_total"]}
    assert ranks == {str(r) for r in range(8)}
    assert {s.labels["training_job"] for s in second["fleetscope_training_steps_total"]} == {"job-a"}
    assert "13" not in {s.labels["rank"] for s in p4d["fleetscope_training_steps_total"]}
    assert total(second, "fleetscope_training_steps_total") > total(first, "fleetscope_training_steps_total")
    # Each rank process writes NCCL Inspector output; the daemon attributes it to the rank through procfs.
    nccl_ranks = {(s.labels["training_job"], s.labels["rank"]) for s in second["fleetscope_nccl_collectives_total"]}
    assert nccl_ranks == {("job-a", str(r)) for r in range(8)}
    assert total(second, "fleetscope_nccl_collectives_total") > total(first, "fleetscope_nccl_collectives_total")
    assert "13" not in {s.labels["rank"] for s in p4d.get("fleetscope_nccl_collectives_total", [])}
    # Every background collector of the node worked on the generated tree.
    failing = [s.labels["collector"] for s in second["fleetscope_collector_success"] if s.value != 1]
    assert failing == []
