"""The simulated cluster: its nodes observed through the daemon's collectors and exposition (no Prometheus)."""

from __future__ import annotations

import itertools
import re
import time

from fleetscope_sim.cluster import SimCluster, make_cluster
from fleetscope_sim.faults import parse_schedule
from fleetscope_sim.virtual import VirtualCluster


def test_nodes_serve_moving_metrics_and_pushed_steps(scratch):
    """Two nodes (a p5, and a p4d that lost one of its 4 EFA devices) with one job of 16 ranks, rank 13 dying at
    t+20 s, observed in virtual time (fleetscope_sim.virtual): each node's collectors read its generated trees and
    NVML fake, its ranks' reports pass the push parser, and the engine's exposition is scraped every 5 s. The same
    claims as a real-time run of the node daemons, on every run the same values; that the daemons serve this
    over HTTP is the live tier's (tests/e2e)."""
    faults = parse_schedule([
        {"kind": "efa_device_missing", "at": 0, "node": "node-01", "device": "rdmap32s27"},
        {"kind": "rank_dies", "at": 20, "job": "job-a", "rank": 13},
    ])
    spec = make_cluster(nodes=2, jobs=1, base_port=1, faults=faults, step_seconds=1.0, collector_interval=1.0)
    cluster = VirtualCluster(spec, str(scratch))
    try:
        cluster.build()
        cluster.run(30.0)
    finally:
        cluster.stop()
    series = cluster.recording.series  # one value per scrape, at t = 0, 5, ..., 30 s

    def at(name: str, scrape: int, node: str) -> dict[str, float]:
        """``name``'s samples on ``node`` at one scrape, by their series (absent ones left out)."""
        found = {key: values[scrape] for key, values in series.items()
                 if key.startswith(name + "{") and f'instance="{node}"' in key}
        return {key: value for key, value in found.items() if isinstance(value, float)}

    def by_rank(name: str, scrape: int, node: str, **labels: str) -> dict[str, float]:
        return {re.search(r'[{,]rank="(\d+)"', key).group(1): value  # type: ignore[union-attr]
                for key, value in at(name, scrape, node).items()
                if all(f'{k}="{v}"' in key for k, v in labels.items())}

    def total(name: str, scrape: int, node: str = "node-00") -> float:
        return sum(at(name, scrape, node).values())

    first, second, last = 1, 2, 6  # t+5 s, t+10 s, t+30 s (rank 13 died at t+20 s)
    assert total("fleetscope_efa_tx_bytes_total", second) > total("fleetscope_efa_tx_bytes_total", first) > 0
    assert total("fleetscope_tcp_out_segments_total", second) > total("fleetscope_tcp_out_segments_total", first)
    # node-00 is a p5 (32 EFA devices), node-01 a p4d that lost one of its 4.
    assert total("fleetscope_efa_devices", second) == 32
    assert (total("fleetscope_efa_devices", second, "node-01"), total("fleetscope_efa_expected_devices", second,
                                                                    "node-01")) == (3, 4)
    # Ranks 0-7 run on node-00 and push there, 8-15 on node-01; all completed the same steps.
    steps = at("fleetscope_training_steps_total", second, "node-00")
    assert set(by_rank("fleetscope_training_steps_total", second, "node-00")) == {str(r) for r in range(8)}
    assert all('training_job="job-a"' in key for key in steps)
    assert total("fleetscope_training_steps_total", second) > total("fleetscope_training_steps_total", first)
    # Rank 13 dies inside its step: every other rank waits for it in the collective, and stops where it stopped.
    last_steps = {**by_rank("fleetscope_training_last_step", last, "node-00"),
                  **by_rank("fleetscope_training_last_step", last, "node-01")}
    survivors = {step for rank, step in last_steps.items() if rank != "13"}
    assert len(last_steps) == 16 and len(survivors) == 1 and last_steps["13"] <= min(survivors), last_steps
    waiting = {rank for rank, value in by_rank("fleetscope_training_phase", last, "node-00", phase="comm").items()
               if value}
    assert waiting == {str(r) for r in range(8)}
    # Its process leaves node-01's procfs: the daemon's steps collector sees it gone, the others alive.
    assert by_rank("fleetscope_training_process_up", second, "node-01") == {str(r): 1 for r in range(8, 16)}
    assert by_rank("fleetscope_training_process_up", last, "node-01") == {str(r): 0 if r == 13 else 1
                                                                         for r in range(8, 16)}
    # Each rank process writes NCCL Inspector output; the daemon attributes it to the rank through procfs.
    assert set(by_rank("fleetscope_nccl_collectives_total", second, "node-00", training_job="job-a")) == \
        {str(r) for r in range(8)}
    assert total("fleetscope_nccl_collectives_total", second) > total("fleetscope_nccl_collectives_total", first)
    # Every background collector of both nodes worked on the generated trees.
    for node in ("node-00", "node-01"):
        failing = [key for key, value in at("fleetscope_collector_success", second, node).items() if value != 1]
        assert failing == [] and len(at("fleetscope_collector_success", second, node)) >= 7, node


def test_the_longest_stretch_between_ticks_is_kept(scratch):
    spec = make_cluster(nodes=1, jobs=1, base_port=0, step_seconds=1.0, tick=0.05)
    cluster = SimCluster(spec, str(scratch))
    cluster.build()
    ticks: list[float] = []
    stalled: list[float] = []

    def stall_once(now: float) -> None:
        ticks.append(now)
        if stalled and now > stalled[0]:
            cluster.stop()  # the tick after the stall is in: enough
        elif now > 0.2 and not stalled:  # the loop stalls once, as on a starved machine
            stalled.append(now)
            time.sleep(0.6)

    try:
        cluster.run(duration=30, on_tick=stall_once)
    finally:
        cluster.stop()
    # The loop also stalls by itself on a loaded machine (r19: 0.67 s just before the injected stall, which then
    # ended past the run's end), so the kept stretch is checked against the ticks the loop really made.
    injected = ticks[ticks.index(stalled[0]) + 1] - stalled[0]
    assert injected >= 0.6
    gap, at = cluster.longest_tick_gap
    stretches = [(later - earlier, later) for earlier, later in itertools.pairwise(ticks)]
    assert gap >= injected
    assert (gap, at) == max(stretches) or at == ticks[0]  # the first tick's stretch counts from the run's start
