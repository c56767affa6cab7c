"""The virtual-time observer itself: what it scrapes is what the daemon serves, and the same on every run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetscope.push.models import RecordError
from fleetscope_sim.cluster import make_cluster
from fleetscope_sim.faults import parse_schedule
from fleetscope_sim.nvml_fake import load_scenario, private_binding
from fleetscope_sim.virtual import Recording, VirtualCluster, parse_exposition


def record(tmp_path: Path, seconds: float, schedule: list[dict[str, object]] = ()) -> Recording:  # type: ignore[assignment]
    spec = make_cluster(nodes=1, jobs=1, base_port=1, profiles=("p4d.24xlarge",),
                        faults=parse_schedule({"faults": list(schedule)}))
    cluster = VirtualCluster(spec, str(tmp_path / "cluster"))
    try:
        cluster.build()
        cluster.run(seconds)
    finally:
        cluster.stop()
    return cluster.recording


def rank_of(series: str) -> str:
    match = re.search(r'[{,]rank="(\d+)"', series)
    assert match is not None, series
    return match.group(1)


def timeless(recording: Recording) -> dict[str, str]:
    """Every series but how long each collection took in real time, the one thing a machine's speed moves (a
    collection's success is stamped when it ends: its virtual start plus that time)."""
    return {s["series"]: s["values"] for s in recording.input_series()
            if not s["series"].startswith(("fleetscope_collector_duration_seconds",
                                           "fleetscope_collector_last_success_timestamp_seconds"))}


def values(recording: Recording, name: str, **labels: str) -> list[object]:
    found = [v for k, v in recording.series.items()
             if k.startswith(name + "{") and all(f'{key}="{value}"' in k for key, value in labels.items())]
    assert len(found) == 1, (name, labels, [k for k in recording.series if k.startswith(name)])
    return found[0]


def test_a_node_is_scraped_through_its_collectors_and_the_same_every_run(tmp_path: Path) -> None:
    first = record(tmp_path / "a", 20.0, [{"kind": "xid", "at": "8s", "node": "node-00", "gpu": 2,
                                            "params": {"xid": 48}}])
    again = record(tmp_path / "b", 20.0, [{"kind": "xid", "at": "8s", "node": "node-00", "gpu": 2,
                                            "params": {"xid": 48}}])
    assert first.scrapes == 5 and timeless(first) == timeless(again)
    assert values(first, "up", instance="node-00") == [1.0] * 5
    # GPUs through the node's own NVML fake and pynvml copy; the Xid from the kernel log and NVML events, once.
    assert values(first, "fleetscope_gpu_utilization_ratio", gpu="3")[-1] == pytest.approx(0.95, abs=0.1)
    xids = values(first, "fleetscope_gpu_xid_errors_total", gpu="2", xid="48")
    assert xids[:2] == [None, None] and xids[2:] == [1.0, 1.0, 1.0]  # logged at t+8 s, collected by the t+10 s scrape
    # Steps through the push parser into the store: the counter moves, the last step is stamped on promtool's clock.
    steps = values(first, "fleetscope_training_steps_total", rank="3")
    assert steps[0] in (None, 0.0) and steps[-1] and steps[-1] > 5  # type: ignore[operator]
    stamp = values(first, "fleetscope_training_last_step_timestamp_seconds", rank="3")[-1]
    assert 15.0 < stamp <= 20.0  # type: ignore[operator]


def test_private_bindings_do_not_share_their_nvml() -> None:
    one, two = load_scenario("h100_8x_healthy"), load_scenario("h100_8x_healthy")
    two.gpu(0).set(temperature=91)
    a, b = private_binding(one), private_binding(two)
    a.nvmlInit()
    b.nvmlInit()
    temps = [m.nvmlDeviceGetTemperature(m.nvmlDeviceGetHandleByIndex(0), 0) for m in (a, b)]
    assert temps[0] != 91 and temps[1] == 91


def test_the_exposition_parser_reads_what_prometheus_reads() -> None:
    text = ('# HELP x_total x\n# TYPE x_total counter\nx_total{a="1",b="q\\"uo\\\\te\\n",c=""} 3.5\n'
            'up 1\nz{a="}"} NaN\n')
    parsed = list(parse_exposition(text, lambda name: name != "up"))
    assert parsed[0] == ("x_total", {"a": "1", "b": 'q"uo\\te\n'}, 3.5)  # the empty label is absent
    assert parsed[1][:2] == ("z", {"a": "}"}) and len(parsed) == 2


def test_a_report_body_the_push_api_refuses_is_not_stored() -> None:
    from fleetscope.push.models import parse_report

    with pytest.raises(RecordError):
        parse_report(json.dumps({"job": "j", "rank": -1, "steps": []}).encode())


def test_nodes_serve_moving_metrics_and_pushed_steps_and_a_dead_rank(tmp_path: Path) -> None:
    """tests/sim/test_cluster.py's claims, in virtual time: counters move, a p4d that lost one of its 4 EFA devices
    says so, each node serves its own ranks' steps, NCCL Inspector output and process liveness; rank 13 dies at
    t+20 s inside its step, its process leaves node-01's procfs, and every survivor waits in the collective."""
    spec = make_cluster(nodes=2, jobs=1, base_port=1, step_seconds=1.0, faults=parse_schedule([
        {"kind": "efa_device_missing", "at": 0, "node": "node-01", "device": "rdmap32s27"},
        {"kind": "rank_dies", "at": 20, "job": "job-a", "rank": 13},
    ]))
    cluster = VirtualCluster(spec, str(tmp_path / "cluster"))
    try:
        cluster.build()
        cluster.run(30.0)
    finally:
        cluster.stop()
    rec = cluster.recording

    def at(name: str, scrape: int, **labels: str) -> dict[str, object]:
        """labels of each series of ``name`` (with ``labels``) -> its value at scrape ``scrape``."""
        out = {}
        for key, points in rec.series.items():
            if key.startswith(name + "{") and all(f'{k}="{v}"' in key for k, v in labels.items()):
                out[key] = points[scrape]
        return out

    def total(name: str, scrape: int, **labels: str) -> float:
        return sum(v for v in at(name, scrape, **labels).values() if isinstance(v, float))

    for name in ("fleetscope_efa_tx_bytes_total", "fleetscope_tcp_out_segments_total",
                 "fleetscope_training_steps_total", "fleetscope_nccl_collectives_total"):
        assert total(name, 3, instance="node-00") > total(name, 2, instance="node-00") > 0, name
    assert list(at("fleetscope_efa_devices", 3, instance="node-00").values()) == [32.0]
    assert list(at("fleetscope_efa_devices", 3, instance="node-01").values()) == [3.0]
    assert list(at("fleetscope_efa_expected_devices", 3, instance="node-01").values()) == [4.0]
    steps = at("fleetscope_training_steps_total", 3, instance="node-00")
    assert {rank_of(k) for k in steps} == {str(r) for r in range(8)}
    assert all('training_job="job-a"' in k for k in steps)
    nccl = at("fleetscope_nccl_collectives_total", 3, instance="node-00")
    assert {rank_of(k) for k in nccl} == {str(r) for r in range(8)}
    alive = {rank_of(k): v for k, v in at("fleetscope_training_process_up", 3, instance="node-01").items()}
    assert alive == {str(r): 1.0 for r in range(8, 16)}  # node-01's daemon sees its rank processes
    after = 6  # t+30 s: rank 13 died at t+20 s
    dead = {rank_of(k): v for k, v in at("fleetscope_training_process_up", after, instance="node-01").items()}
    assert dead["13"] == 0.0 and all(v == 1.0 for r, v in dead.items() if r != "13"), dead
    last = {rank_of(k): v for k, v in at("fleetscope_training_last_step", after).items()}
    survivors = {v for r, v in last.items() if r != "13"}
    assert len(last) == 16 and len(survivors) == 1 and last["13"] in (min(survivors), min(survivors) - 1), last  # type: ignore[type-var, operator]
    waiting = {rank_of(k) for k, v in at("fleetscope_training_phase", after, phase="comm").items()
               if v == 1.0}
    assert waiting == {str(r) for r in range(16)} - {"13"}
    failing = {k for k, v in at("fleetscope_collector_success", after).items() if v != 1.0}
    assert failing == set()
