"""The simulated jobs' NCCL Inspector output: the same steps as their step records, seen by NCCL."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from fleetscope.sources.fs import Root
from fleetscope.sources.gpu_jobs import attribute_process
from fleetscope_sim.faults import parse_schedule
from fleetscope_sim.inspector import InspectorNode, StepCollectives, rank_pid
from fleetscope_sim.training import JobModel, JobSpec

NODES = ("n0", "n1")


def _run(tmp_path: Path, faults=(), seconds=240.0) -> tuple[StepCollectives, list[dict]]:
    spec = JobSpec("job-a", NODES, step_seconds=2.0)
    job = JobModel(spec, seed=3)
    nodes = [(name, InspectorNode(str(tmp_path / name / "nccl"), str(tmp_path / name / "proc"), hostname=name))
             for name in NODES]
    collectives = StepCollectives("job-a", nodes, spec.ranks_per_node, spec.step_seconds * spec.comm_share)
    collectives.start()
    records = []
    for now in range(1, int(seconds) + 1):  # one tick a second, as the cluster runs
        step_records = [r for _, r in job.advance(float(now), 1_700_000_000.0, list(faults))]
        collectives.write(step_records)
        records += step_records
    return collectives, records


def _collective_seconds(tmp_path: Path) -> dict[int, float]:
    """Per rank: the summed execution time of its collectives, read back from every node's files."""
    out: dict[int, float] = {}
    for name in NODES:
        directory = tmp_path / name / "nccl"
        for file in os.listdir(directory):
            for line in (directory / file).read_text().splitlines():
                record = json.loads(line)
                rank = record["header"]["rank"]
                out[rank] = out.get(rank, 0.0) + record["coll_perf"]["coll_exec_time_us"] / 1e6
    return out


def test_every_rank_writes_its_own_file_and_procfs_attributes_it_to_its_job(tmp_path):
    _run(tmp_path, seconds=10)
    for index, name in enumerate(NODES):
        files = sorted(os.listdir(tmp_path / name / "nccl"))
        assert files == sorted(f"{name}-pid{rank_pid(local)}.log" for local in range(8))
        first = json.loads((tmp_path / name / "nccl" / files[0]).read_text().splitlines()[0])
        assert first["header"]["n_ranks"] == 16 and first["header"]["nnodes"] == 2
        assert first["coll_perf"]["coll"] == "AllReduce" and first["coll_perf"]["coll_msg_size_bytes"] == 25 << 20
        attribution = attribute_process(Root(str(tmp_path / name / "proc")), rank_pid(3))
        assert attribution is not None
        rank = str(index * 8 + 3)
        assert (attribution.training_job, attribution.rank, attribution.local_rank) == ("job-a", rank, "3")


def test_healthy_ranks_spend_about_the_same_time_in_collectives(tmp_path):
    _, records = _run(tmp_path)
    seconds = _collective_seconds(tmp_path)
    median = statistics.median(seconds.values())
    assert set(seconds) == set(range(16))
    assert min(seconds.values()) / median > 0.9
    assert max(seconds.values()) / median < 1.1
    # The transfers and the waits fill about the step records' communication time.
    comm = sum(r["comm_seconds"] for r in records if r["rank"] == 0)
    assert 0.6 < seconds[0] / comm < 1.4


def test_a_throttled_rank_arrives_last_so_its_collectives_are_shortest(tmp_path):
    faults = parse_schedule([{"kind": "thermal_throttle", "at": 0, "node": "n1", "gpu": 2,
                              "params": {"slowdown": 1.3}}])
    _run(tmp_path, faults)
    seconds = _collective_seconds(tmp_path)
    median = statistics.median(seconds.values())
    assert seconds[10] / median < 0.5  # the transfer alone; its peers add their wait for it
    assert all(0.9 < s / median < 1.1 for rank, s in seconds.items() if rank != 10)


def test_when_a_rank_dies_no_rank_completes_another_collective_and_its_process_leaves_procfs(tmp_path):
    faults = parse_schedule([{"kind": "rank_dies", "at": 20, "job": "job-a", "rank": 6}])
    collectives, _ = _run(tmp_path, faults, seconds=60)
    last = set()
    for name in NODES:
        directory = tmp_path / name / "nccl"
        for file in os.listdir(directory):
            record = json.loads((directory / file).read_text().splitlines()[-1])
            last.add((record["coll_perf"]["coll_sn"], record["metadata"]["dump_timestamp_us"] // 1_000_000))
    # Every rank's last record is the same collective of the last step completed before the death.
    assert len({sn for sn, _ in last}) == 1 and max(t for _, t in last) <= 1_700_000_000 + 20
    proc = tmp_path / "n0" / "proc" / str(rank_pid(6))
    stat = (proc / "stat").read_text()
    assert stat.split(") ")[1].split()[19] == str(collectives.process(6).start_time)
    collectives.exited(6)
    assert not proc.exists() and (tmp_path / "n0" / "nccl" / f"n0-pid{rank_pid(6)}.log").exists()
