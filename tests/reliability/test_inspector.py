"""The NCCL Inspector directory as an attack surface, against a real daemon on 127.0.0.1 (#30 item 1).

Every job on a node can write to the Inspector directory and the daemon reads
it as root: a writer that floods it with communicators must not grow the
daemon past the DaemonSet's memory limit or ``/metrics`` past what a scrape
can carry.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetscope_sim.harness import eventually
from tests.reliability.processes import MEMORY_LIMIT_BYTES, Daemon

pytestmark = pytest.mark.live

MEMORY_CEILING = int(MEMORY_LIMIT_BYTES * 0.85)
METRICS_CEILING = 2 << 20  # nccl.max-keys (1024) keys of 3 series, an info each, labels capped: about 1 MB


def flood_lines(start: int, size: int, pid: int) -> tuple[bytes, int]:
    """About ``size`` bytes of valid records, each from a communicator never seen before, with a long name."""
    name = "n" * 2000
    lines = []
    total = 0
    index = start
    while total < size:
        line = (
            f'{{"header":{{"id":"0x{index:x}","comm_name":"{name}{index}","rank":0,"n_ranks":2,"nnodes":1}},'
            f'"metadata":{{"inspector_output_format_version":"v4.0","dump_timestamp_us":{index},'
            f'"hostname":"flood","pid":{pid}}},"coll_perf":{{"coll":"AllReduce{index % 7}","coll_sn":{index},'
            f'"coll_msg_size_bytes":{1 << (index % 30)},"coll_exec_time_us":10,"coll_busbw_gbs":1.0}}}}\n'
        )
        lines.append(line)
        total += len(line)
        index += 1
    return "".join(lines).encode(), index - start


def counted(text: str) -> float:
    """Lines the collector has read: records (some then refused past nccl.max-keys) and lines it skipped."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fleetscope_nccl_records_total" or (
                    sample.name == "fleetscope_nccl_skipped_records_total"
                    and sample.labels["reason"] != "key_limit"):
                total += sample.value
    return total


def caught_up(node: Daemon, written: int, sizes: list[int]) -> bytes | None:
    """/metrics once the collector has counted ``written`` lines, else None; every size seen goes to ``sizes``."""
    _, status, text = node.get("/metrics")
    assert status == 200
    sizes.append(len(text))
    return text if counted(text.decode()) >= written else None


def test_a_communicator_flood_keeps_memory_and_metrics_bounded(
        daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    """Measured before the fix: 5 appends of 7 MiB made 86,868 series, a 33 MB /metrics and 509 MiB RSS."""
    dump = tmp_path / "dump"
    dump.mkdir()
    # The writer is this test process (a live process owning its file), as the plugin in a rank would be.
    path = dump / f"flood-pid{os.getpid()}.log"
    node = daemon({"collector.nccl": "true", "collector.efa": "false", "collector.netdev": "false",
                   "collector.netstat": "false", "nccl.dir": str(dump), "path.procfs": "/proc",
                   "collector.nccl.interval": "1s"})
    written = 0
    sizes: list[int] = []
    for _ in range(5):
        body, lines = flood_lines(written, 7 << 20, os.getpid())
        with open(path, "ab") as handle:
            handle.write(body)
        written += lines
        # Until the collector has read every line written: a generous limit, which only a collector that stops
        # reading can reach (a 7 MiB append takes it a few seconds on a quiet machine, more beside other tests).
        text = eventually(partial(caught_up, node, written, sizes), 300, "the collector to read the flood",
                          interval=0.5)
        assert counted(text.decode()) == written, "the collector fell behind the flood"
        assert node.peak_rss() < MEMORY_CEILING, f"peak RSS {node.peak_rss() >> 20} MiB after {written} lines"
    largest = max(sizes)
    print(f"{written} lines, largest /metrics {largest} bytes, peak RSS {node.peak_rss() >> 20} MiB")
    assert largest < METRICS_CEILING
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    refused = {s.labels["reason"]: s.value for s in families["fleetscope_nccl_skipped_records"].samples
               if s.name.endswith("_total")}
    assert refused["key_limit"] > 0
