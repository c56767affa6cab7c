"""Replay a capture through the real daemon, on any machine.

The capture's ``sys/``, ``proc/`` and ``kmsg`` become the daemon's mount points, its ``nvml.yaml`` is
installed as the NVML fake below the real ``pynvml`` binding (so a replay never touches a real GPU, even
on a GPU machine), and its ``ena.json`` stands in for the ENA driver's ioctl. The captured daemon settings
apply, so ``/metrics`` is what the node's daemon served, identities redacted.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from fleetscope.capture.archive import Capture, open_capture
from fleetscope.config import Config, load


class CapturedEnaReader:
    """The ENA collector's reader over the capture's ``ena.json``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> Any:
        from fleetscope.errors import SourceError
        from fleetscope.sources.ethtool import EthtoolReading, InterfaceStats, UnreadableInterface

        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError) as exc:
            raise SourceError(f"{self.path}: {exc}") from None
        if data.get("error"):
            raise SourceError(str(data["error"]))
        return EthtoolReading(
            tuple(InterfaceStats(i["device"], i["driver"], dict(i["stats"])) for i in data.get("interfaces", [])),
            tuple(UnreadableInterface(u["device"], u["driver"], u["reason"]) for u in data.get("unreadable", [])),
        )


def replay_config(capture: Capture, extra: Mapping[str, Any] | None = None) -> Config:
    """The captured settings, with every path pointing into the capture."""
    flags: dict[str, Any] = {
        **capture.settings,
        "path.sysfs": capture.path("sys"),
        "path.procfs": capture.path("proc"),
        "path.kmsg": capture.path("kmsg"),  # absent when the node's log was unreadable: so it is here
        "gpu.jobs-dir": capture.path("jobs"),
    }
    flags.update(extra or {})
    return load(flags, environ={})


def install_nvml(capture: Capture) -> Any:
    """The captured NVML as the fake below ``pynvml`` (a node without NVML: a library that is not there)."""
    from fleetscope_sim.nvml_fake import FakeNvml, NvmlReturn, install, load_scenario

    path = capture.path("nvml.yaml")
    if os.path.isfile(path):
        fake = load_scenario(path)
    else:
        fake = FakeNvml([], name="no NVML on the captured node",
                        init_error=NvmlReturn.named("NVML_ERROR_LIBRARY_NOT_FOUND"))
    install(fake)
    return fake


def replay_collectors(config: Config, capture: Capture) -> dict[str, Any]:
    """The registry's collectors, the ENA one reading the capture's statistics."""
    from fleetscope.serve.daemon import build_collectors

    built = build_collectors(config)
    if "ena" in built:
        from fleetscope.collectors.ena import EnaCollector

        built["ena"] = EnaCollector(config, reader=CapturedEnaReader(capture.path("ena.json")))
    return built


def serve_capture(source: str, listen: str, settings: Mapping[str, Any] | None = None) -> None:
    """``fleetscope simulate-node --from CAPTURE``: serve the captured node until stopped."""
    from fleetscope.serve.daemon import build_daemon

    workdir = tempfile.mkdtemp(prefix="fleetscope-replay-")
    fake = None
    try:
        capture = open_capture(source, workdir)
        config = replay_config(capture, {"web.listen-address": listen, **(settings or {})})
        fake = install_nvml(capture)
        daemon = build_daemon(config, collectors=replay_collectors(config, capture))
        asyncio.run(daemon.serve())
    finally:
        if fake is not None:
            fake.release()
        shutil.rmtree(workdir, ignore_errors=True)
