"""A fake GPU node assembled from the shipped fixtures, its daemon, and one scrape of it."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi.testclient import TestClient

from fleetscope.config import Config, load
from fleetscope.serve.daemon import Daemon, build_collectors, build_daemon
from fleetscope.serve.engine import CollectorRunner
from fleetscope.sources.ethtool import EthtoolReading, InterfaceStats, UnreadableInterface
from fleetscope_sim.kernel_tree import ProcfsTree
from fleetscope_sim.nvml_fake import FakeNvml, install, load_scenario, uninstall, write_sysfs
from tests.conftest import FIXTURES

BOOT = 1_700_000_000
KMSG = os.path.join(FIXTURES, "kmsg", "variants.kmsg")
# Samples whose value is the time they were taken (or how long that took), not the node's state.
TIMING = re.compile(r"^[a-z_]*(_timestamp_seconds|_duration_seconds|build_info)[{ ]")
ENA_STATS = {"bw_in_allowance_exceeded": 11, "bw_out_allowance_exceeded": 22, "pps_allowance_exceeded": 33,
             "conntrack_allowance_exceeded": 4, "linklocal_allowance_exceeded": 5,
             "conntrack_allowance_available": 499_812, "tx_timeout": 1, "total_resets": 2, "reset_fail": 0,
             "wd_expired": 3, "missing_tx_cmpl": 7}


def ena_reading() -> EthtoolReading:
    return EthtoolReading((InterfaceStats("ens32", "ena", dict(ENA_STATS)),),
                          (UnreadableInterface("ens33", "ena", "EPERM"),))


@dataclass
class FixtureNode:
    """One fixture tree with GPUs on its PCI bus, a boot time, a kernel log and an NVML scenario."""

    root: str
    scenario: str | None
    settings: dict[str, Any]

    @classmethod
    def build(cls, root: str, tree: str, scenario: str | None, kmsg: str | None = KMSG,
              settings: Mapping[str, Any] | None = None) -> FixtureNode:
        sysfs, procfs = os.path.join(root, "sys"), os.path.join(root, "proc")
        shutil.copytree(os.path.join(FIXTURES, tree, "sys"), sysfs, symlinks=True)
        if os.path.isdir(os.path.join(FIXTURES, tree, "proc")):
            shutil.copytree(os.path.join(FIXTURES, tree, "proc"), procfs, symlinks=True)
        ProcfsTree(procfs).stat(BOOT)
        if scenario is not None:
            write_sysfs(load_scenario(scenario), sysfs)
        if kmsg is not None:
            shutil.copyfile(kmsg, os.path.join(root, "kmsg"))
        node_settings = {
            "path.sysfs": sysfs, "path.procfs": procfs, "path.kmsg": os.path.join(root, "kmsg"),
            "gpu.jobs-dir": os.path.join(root, "jobs"), "collector.steps": False,
            # A first collection of 8 GPUs is all Python over the fake: on a loaded machine it once took over 2 s
            # (r13), and a timed-out GPU collector replays as a different node.
            "collector.gpu.timeout": 20,
            **(settings or {}),
        }
        return cls(root, scenario, node_settings)

    @property
    def config(self) -> Config:
        return load(self.settings, environ={})

    def fake(self) -> FakeNvml | None:
        """A fresh NVML for this node, installed below pynvml (None: no NVML library on the node)."""
        if self.scenario is None:
            uninstall()
            return None
        fake = load_scenario(self.scenario)
        install(fake)
        return fake


def node_collectors(config: Config, ena: Callable[[], Any]) -> dict[str, Any]:
    built = build_collectors(config)
    if "ena" in built:
        from fleetscope.collectors.ena import EnaCollector

        built["ena"] = EnaCollector(config, reader=ena)
    return built


def scrape(daemon: Daemon, fake: FakeNvml | None, collections: int = 2) -> str:
    """/metrics after ``collections`` rounds (GPM ratios need two), with NVML events delivered first."""
    try:
        for round_ in range(collections):
            if round_ == collections - 1 and fake is not None:
                _events_delivered(fake)
            for runner in daemon.engine.runners:
                if isinstance(runner, CollectorRunner):  # live collectors are read at scrape time
                    runner.run_once()
        with TestClient(daemon.app) as client:
            response = client.get("/metrics")
        assert response.status_code == 200
        return response.text
    finally:
        if fake is not None:
            fake.release()  # first: a collector stuck in a hanging call holds the NVML source's lock
        daemon.engine.stop()


def _events_delivered(fake: FakeNvml, timeout: float = 10.0) -> None:
    """Wait until every pending NVML event reached the daemon's watcher (and a little for its ledger)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = any(s["queue"] for s in fake._sets.values())
        if not fake.pending_events and not queued:
            break
        time.sleep(0.05)
    time.sleep(0.2)


LISTENER = re.compile(r"^(# (HELP|TYPE) )?fleetscope_http_")


def steady(text: str) -> str:
    """The exposition without the samples that are times, nor the HTTP listener's own gauges (they
    describe the server that answered, not the node)."""
    return "".join(line + "\n" for line in text.splitlines() if not TIMING.match(line) and not LISTENER.match(line))


def pseudonymised(text: str, mapping_file: str) -> str:
    """``text`` as the capture's redaction would write it: every original replaced by its pseudonym."""
    with open(mapping_file, encoding="utf-8") as handle:
        mapping = json.load(handle)
    pairs = sorted(((original, pseudonym) for table in mapping.values() for pseudonym, original in table.items()),
                   key=lambda pair: -len(pair[0]))
    for original, pseudonym in pairs:
        text = re.sub(r"(?<![0-9A-Za-z])" + re.escape(original) + r"(?![0-9A-Za-z])", pseudonym, text, flags=re.I)
    return text


def build(config: Config, ena: Callable[[], Any]) -> Daemon:
    return build_daemon(config, collectors=node_collectors(config, ena))
