"""Series per node with the NCCL Inspector enabled, and what reading its output costs.

Measured with the real ``nccl`` collector and reader, the way the daemon runs
them: on the committed 8-rank fixture of a 3D-parallel job
(``tests/fixtures/nccl/node8``), on an 8-rank data-parallel node the
simulator writes, and on a long stream of plugin-format records for the
reader's CPU per record. Run alone with ``python3 -m benchmarks.nccl`` (prints
the section), or as part of ``benchmarks/run.py``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
NODE8 = os.path.join(HERE, "..", "tests", "fixtures", "nccl", "node8")
HEADING = "## 6b. Series per node with the NCCL Inspector"


@dataclass(frozen=True)
class NodeSeries:
    name: str
    comms_per_rank: int
    keys_per_rank: int
    series: int
    info: int
    per_key: int
    node_level: int


@dataclass(frozen=True)
class NcclResults:
    nodes: tuple[NodeSeries, ...]
    records: int
    bytes_read: int
    cpu_seconds: float


def _series(dump: str, procfs: str, name: str) -> NodeSeries:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from fleetscope.collectors.nccl import NcclCollector
    from fleetscope.config import load

    # The fixture's procfs has no Uid lines: its files (this checkout's) are read as a configured owner's.
    collector = NcclCollector(load({"nccl.dir": dump, "path.procfs": procfs, "nccl.ttl": "100000h",
                                    "nccl.file-owners": str(os.getuid())}, environ={}))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(collector.collect()))  # type: ignore[arg-type]
    samples = [s for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples]
    info = [s for s in samples if s.name == "fleetscope_nccl_communicator_info"]
    per_key = [s for s in samples if "size_bucket" in s.labels]
    ranks = {s.labels["rank"] for s in info} or {""}
    counts = ("fleetscope_nccl_collectives_total", "fleetscope_nccl_p2p_operations_total")
    keys = [s for s in per_key if s.name in counts]
    return NodeSeries(name, len(info) // len(ranks), len(keys) // len(ranks), len(samples), len(info), len(per_key),
                      len(samples) - len(info) - len(per_key))


class _Fixed:
    def __init__(self, metrics: list) -> None:  # type: ignore[type-arg]
        self.metrics = metrics

    def collect(self) -> list:  # type: ignore[type-arg]
        return self.metrics


def _data_parallel_node(root: str) -> tuple[str, str]:
    """8 ranks of a data-parallel job on one node, 20 s of steps, as the simulator writes them."""
    from fleetscope_sim.inspector import CollectiveSpec, InspectorJob, InspectorNode

    node = InspectorNode(os.path.join(root, "dump"), os.path.join(root, "proc"), hostname="p5-node")
    job = InspectorJob("ddp", [node], 8, (CollectiveSpec("AllReduce", 25 << 20, 4, 150e9),
                                          CollectiveSpec("AllReduce", 64 << 10, 1, 5e9)), seed=3)
    job.start(0.0, first_pid=7000)
    job.advance(20.0)
    return node.dump_dir, node.procfs


def _reader_cost(root: str, records: int, clock: Callable[[], float] = time.process_time) -> tuple[int, int, float]:
    """(records, bytes, CPU seconds) to read and parse a file of ``records`` plugin-format lines."""
    from fleetscope.sources.nccl import InspectorReader
    from fleetscope_sim.inspector import Comm, record_line

    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "node-pid1.log")
    comm = Comm("0x5c1f2a3b4d6e7f8", 3, 16, 2, "default_pg")
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(
            record_line(comm, "AllReduce", n, 26214400, 400 + n % 50, hostname="node", pid=1,
                        dump_us=1_767_225_600_000_000 + n)
            for n in range(records))
    size = os.path.getsize(path)
    reader = InspectorReader(root, max_read_bytes=size + 1, ttl=1e12, owners=(os.getuid(),))
    started = clock()
    count = sum(1 for _ in reader.poll())
    return count, size, clock() - started


def measure(stream_records: int = 50_000) -> NcclResults:
    with tempfile.TemporaryDirectory(prefix="fleetscope-nccl-bench-") as tmp:
        nodes = (
            _series(os.path.join(NODE8, "dump"), os.path.join(NODE8, "proc"),
                    "3D-parallel job (tensor group of 8, data-parallel pair, pipeline pair, world; fixture node8)"),
            _series(*_data_parallel_node(os.path.join(tmp, "ddp")),
                    "data-parallel job (one communicator, 25 MiB gradient buckets and a small all-reduce)"),
        )
        records, size, cpu = _reader_cost(os.path.join(tmp, "stream"), stream_records)
    return NcclResults(nodes, records, size, cpu)


def render(results: NcclResults) -> list[str]:
    lines = [
        HEADING,
        "",
        ("The `nccl` collector on an 8-rank node (one file per rank), one collection, every record attributed to "
         "its training job and rank. Per rank and communicator: one `fleetscope_nccl_communicator_info` and three "
         "counters per (operation, size bucket); 14 reader series per node. The p5 node above has no Inspector "
         "output: add these to its total."),
        "",
        "| 8-rank node | communicators per rank | keys per rank | info | per-key series | node-level | series |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {node.name} | {node.comms_per_rank} | {node.keys_per_rank} | {node.info} | {node.per_key} "
        f"| {node.node_level} | **{node.series}** |"
        for node in results.nodes
    ]
    per_record = results.cpu_seconds / max(results.records, 1)
    lines += [
        "",
        (f"Reading: {results.records:,} plugin-format records ({results.bytes_read / results.records:.0f} bytes "
         f"each) read and parsed in {results.cpu_seconds:.2f} s of CPU, **{per_record * 1e6:.1f} µs per record**. "
         "A data-parallel rank with four gradient buckets at 4 steps a second logs 20 records a second, 160 per "
         f"8-rank node: {160 * per_record * 100:.2f}% of a core; a tensor-parallel job logging 200 collectives a "
         f"second per rank costs {1600 * per_record * 100:.1f}% (raise NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES to log "
         "fewer small collectives)."),
        "",
    ]
    return lines


def main() -> int:
    print("\n".join(render(measure())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
