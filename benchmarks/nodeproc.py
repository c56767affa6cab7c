"""One benchmark node daemon: the real fleetscope pipeline over a simulated node's tree.

Started as ``python3 -m benchmarks.nodeproc --root DIR --listen 127.0.0.1:0 --ready-file PATH ...``
by :mod:`benchmarks.harness` (the daemon writes the addresses it bound to the ready file). It is the
simulator's ``simulate-node`` with two knobs the benchmarks need: which collectors run, and whether they
keep their registry default intervals (the production setting) or one fixed interval.

Unlike the simulator, the GPU state feed is installed once and not polled:
its poll loop is simulator work that would be billed to the daemon's CPU.
The fake GPUs keep their values; the collector does the same calls either way.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from fleetscope.config import LogConfig
from fleetscope.logs import setup_logging


def node_flags(collectors: list[str], interval: str, pause_after: str = "") -> dict[str, Any]:
    """Config flags enabling exactly ``collectors``, at default intervals or one fixed interval (the
    simulator's own timing rule, :func:`fleetscope_sim.nodeproc.collector_flags`)."""
    from fleetscope_sim.nodeproc import collector_flags

    flags: dict[str, Any] = {"collection.pause-after": pause_after} if pause_after else {}
    flags.update(collector_flags(None if interval == "default" else float(interval), collectors))
    return flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.nodeproc")
    parser.add_argument("--root", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--ready-file", default="", help="web.ready-file: where the daemon writes what it bound")
    parser.add_argument("--collectors", default="efa,netdev,netstat,ena,gpu,steps")
    parser.add_argument("--interval", default="default", help="'default' or seconds for every background collector")
    parser.add_argument("--pause-after", default="", help="collection.pause-after (default: the daemon's)")
    args = parser.parse_args(argv)
    setup_logging(LogConfig(level="warning"))

    from fleetscope.serve.daemon import build_daemon
    from fleetscope_sim.nodeproc import build_node_collectors, node_config
    from fleetscope_sim.tree import NodePaths

    collectors = [name for name in args.collectors.split(",") if name]
    paths = NodePaths(args.root)
    flags = node_flags(collectors, args.interval, args.pause_after)
    if args.ready_file:
        flags["web.ready-file"] = args.ready_file
    config = node_config(paths, args.listen, 15.0, flags)
    if "gpu" in collectors:
        from fleetscope_sim.gpufeed import GpuFeed

        GpuFeed(paths).install()  # fake NVML below pynvml; no poll thread (see module doc)
    daemon = build_daemon(config, collectors=build_node_collectors(config, paths))
    asyncio.run(daemon.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
