"""``fleetscope capture`` and ``fleetscope simulate-node --from`` as a user runs them: two processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import urllib.request

from fleetscope_sim.harness import Daemon
from fleetscope_sim.nvml_fake import uninstall
from tests.capture.nodes import FixtureNode, pseudonymised, scrape, steady
from tests.capture.nodes import build as build_node
from tests.conftest import ROOT


def _fleetscope(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetscope", *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["PYTHONPATH"] = os.path.join(ROOT, "exporter") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def test_capture_then_replay_from_the_command_line(tmp_path) -> None:
    node = FixtureNode.build(str(tmp_path / "node"), "p4d", None)  # this machine has no NVML library
    flags = [f"--{key}={value}" for key, value in node.settings.items() if key != "collector.steps"]
    archive, mapping = str(tmp_path / "p4d.tar.gz"), str(tmp_path / "mapping.json")
    done = subprocess.run(_fleetscope("capture", *flags, "--no-collector.steps", "--no-collector.ena", "-o", archive,
                                      "--mapping", mapping), capture_output=True, text=True, timeout=120,
                          env=_env(), check=False)
    assert done.returncode == 0, done.stderr
    assert f"wrote {archive}" in done.stdout and "nvml: 0 GPUs (NVML unavailable" in done.stdout
    assert stat.S_IMODE(os.stat(mapping).st_mode) == 0o600

    uninstall()
    settings = {**node.settings, "collector.ena": False}
    original = scrape(build_node(FixtureNode(node.root, None, settings).config, lambda: None), None)

    ready = tmp_path / "replay.ready"
    replay = Daemon(_fleetscope("simulate-node", "--from", archive, "--listen", "127.0.0.1:0",
                                f"--set=web.ready-file={ready}"), tmp_path / "replay.log", env=_env(), ready_file=ready)
    try:
        replay.start()
        status, replayed = _get(replay.url + "/metrics")
    finally:
        replay.stop()
    assert status == 200
    assert steady(replayed) == steady(pseudonymised(original, mapping))
    assert 'fleetscope_collector_success{collector="efa"} 1.0' in replayed


def test_simulate_node_names_a_broken_capture(tmp_path) -> None:
    bad = tmp_path / "not-a-capture.tar.gz"
    bad.write_bytes(b"nonsense")
    done = subprocess.run(_fleetscope("simulate-node", "--from", str(bad), "--listen", "127.0.0.1:1"),
                          capture_output=True, text=True, timeout=60, env=_env(), check=False)
    assert done.returncode == 2 and "cannot open" in done.stderr
