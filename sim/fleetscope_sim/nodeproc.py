"""One simulated node's daemon: the real fleetscope pipeline over the node's generated trees.

Run as ``fleetscope simulate-node --root DIR --listen HOST:PORT``. The config
is the normal one with every path pointing into DIR. Two sources cannot be
files on a real node and are fed from the simulator's state files instead:
ENA statistics (an ioctl on a real NIC) come from ``ena.json`` through the
ENA collector's reader seam, and the GPUs come from ``gpu.json`` through the
NVML fake. Each node is its own process because NVML (and so its fake) is
process-global.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Collection, Mapping
from typing import Any

from fleetscope.config import Config, load
from fleetscope_sim.tree import NodePaths

logger = logging.getLogger(__name__)


def node_config(paths: NodePaths, listen: str, interval: float, extra: Mapping[str, Any] | None = None) -> Config:
    """The daemon config of one simulated node: real settings, paths into the node's tree."""
    flags: dict[str, Any] = {
        "web.listen-address": listen,
        "path.sysfs": paths.sysfs,
        "path.procfs": paths.procfs,
        "path.kmsg": paths.kmsg,
        "gpu.jobs-dir": paths.jobs_dir,
        "nccl.dir": paths.nccl_dir,
        "log.level": "warning",
    }
    flags.update(collector_flags(interval))
    try:
        with open(paths.node_info, encoding="utf-8") as handle:
            info = json.load(handle)
        flags["gpu.expected-count"] = info["gpu_count"]
        flags["efa.expected-count"] = info["efa_count"]
    except (OSError, ValueError, KeyError) as exc:
        logger.warning("no expected device counts from %s: %s", paths.node_info, exc)
    flags.update(extra or {})
    return load(flags, environ={})


def collector_flags(interval: float | None, enabled: Collection[str] | None = None) -> dict[str, Any]:
    """Every background collector's interval and timeout: ``interval`` seconds (None: the registry's
    defaults, the production setting) and a timeout of 80% of it, at least 1 s and never above the
    collector's own default. ``enabled``: exactly these collectors run (None: the config's choice)."""
    from fleetscope.collectors import REGISTRY

    flags: dict[str, Any] = {}
    for name, entry in REGISTRY.items():
        if enabled is not None:
            flags[f"collector.{name}"] = name in enabled
        if entry.live:
            continue
        if interval is None:
            flags[f"collector.{name}.interval"] = entry.default_interval
            flags[f"collector.{name}.timeout"] = entry.default_timeout
        else:
            flags[f"collector.{name}.interval"] = interval
            flags[f"collector.{name}.timeout"] = min(entry.default_timeout, max(1.0, interval * 0.8))
    if interval is not None:  # the GPUs' slow values every 6 collections, as the defaults (60 s at 10 s) have it
        flags["gpu.slow-interval"] = 6 * interval
    return flags


class FileEnaReader:
    """ENA statistics from the simulator's ``ena.json`` (``{interface: {stat: value}}``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> Any:
        from fleetscope.sources.ethtool import EthtoolReading, InterfaceStats

        with open(self.path, encoding="utf-8") as handle:
            data = json.load(handle)
        interfaces = tuple(InterfaceStats(device=name, driver="ena", stats=dict(stats)) for name, stats in data.items())
        return EthtoolReading(interfaces=interfaces, unreadable=())


def build_node_collectors(config: Config, paths: NodePaths) -> dict[str, Any]:
    """The registry's collectors, with the ENA reader swapped for the simulator's state file.

    The GPU collector is the normal one: the NVML fake is installed before it is built.
    """
    from fleetscope.serve.daemon import build_collectors

    built = build_collectors(config)
    if "ena" in built:
        from fleetscope.collectors.ena import EnaCollector

        built["ena"] = EnaCollector(config, reader=FileEnaReader(paths.ena_stats))
    return built


def serve_node(paths: NodePaths, listen: str, interval: float, settings: Mapping[str, Any] | None = None) -> None:
    from fleetscope.serve.daemon import build_daemon
    from fleetscope_sim.gpufeed import GpuFeed

    config = node_config(paths, listen, interval, settings)
    feed = GpuFeed(paths)
    feed.install()
    feed.start()
    daemon = build_daemon(config, collectors=build_node_collectors(config, paths))
    try:
        asyncio.run(daemon.serve())
    finally:
        feed.stop()
