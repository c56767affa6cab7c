"""#19's check: a capture of each shipped fixture, replayed through the real daemon, serves the same /metrics.

Each case is one fixture tree (with an NVML scenario's GPUs on its PCI bus, the kernel-log fixture and
ENA statistics): the node's daemon is scraped, the node is captured (through the real pynvml over the
NVML fake), the archive is opened again and replayed through the real daemon with the captured fake.
The two expositions must be equal apart from the samples that are times, with the originals of every
redacted value replaced by their pseudonyms (the capture's own ``--mapping`` table).
"""

from __future__ import annotations

import os

import pytest

from fleetscope.capture.archive import open_capture, render, take_snapshot, write_archive, write_mapping
from fleetscope.serve.daemon import build_daemon
from fleetscope_sim.nvml_fake import scenario_names, uninstall
from fleetscope_sim.replay import CapturedEnaReader, install_nvml, replay_collectors, replay_config
from tests.capture.nodes import FixtureNode, build, ena_reading, pseudonymised, scrape, steady
from tests.fixtures import make_fixtures as mk

CODES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "codes.yaml")
# Every fixture tree and every NVML scenario, each at least once.
CASES = [
    ("p5", "h100_8x_healthy", {"gpu.expected-count": 8, "efa.expected-count": 32}),
    ("p4d", "a100_8x", {"net.device-exclude": "^lo$"}),
    ("old-driver", "older_driver", {}),
    ("flat", "unsupported_fields", {}),
    ("malformed", "mig_enabled", {}),
    ("p5", "lost_gpu", {}),
    ("p5", "xid_events", {}),
    ("p5", "fabric_manager_down", {}),
    ("p5", "hanging_call", {"collector.gpu.timeout": 1}),
    ("p4d", None, {}),  # no NVML library at all
    ("p5", CODES, {}),  # return codes other than NOT_SUPPORTED, a GPU NVML cannot open
]


def test_the_cases_cover_every_shipped_fixture() -> None:
    assert {tree for tree, _, _ in CASES} == set(mk.TREES)
    assert {scenario for _, scenario, _ in CASES} - {None, CODES} == set(scenario_names())


@pytest.fixture(autouse=True)
def no_fake_left() -> object:
    yield
    uninstall()


@pytest.mark.parametrize("tree, scenario, settings", CASES,
                         ids=[f"{t}-{os.path.basename(str(s)).removesuffix('.yaml')}" for t, s, _ in CASES])
def test_capture_replays_to_the_same_metrics(tmp_path, tree, scenario, settings) -> None:
    node = FixtureNode.build(str(tmp_path / "node"), tree, scenario, settings=settings)

    # the capture first: NVML events are delivered once, to whoever registers first
    capturing = node.fake()
    # A call that never returns (hanging_call) is waited on for the capture's whole NVML budget: 1 s there.
    snapshot = take_snapshot(node.config, ena_reader=ena_reading, nvml_timeout=1.0 if scenario == "hanging_call"
                             else 5.0, gpm_interval=0.1, event_wait=0.3)
    if capturing is not None:
        capturing.release()
    uninstall()
    rendered = render(snapshot)
    archive, mapping = str(tmp_path / "node.tar.gz"), str(tmp_path / "mapping.json")
    write_archive(rendered, archive)
    write_mapping(rendered, mapping)

    fake = node.fake()
    original = scrape(build(node.config, ena_reading), fake)
    uninstall()

    capture = open_capture(archive, str(tmp_path / "replay"))
    config = replay_config(capture)
    replayed = scrape(build_daemon(config, collectors=replay_collectors(config, capture)), install_nvml(capture))

    assert steady(replayed) == steady(pseudonymised(original, mapping))
    if scenario not in (None, "hanging_call"):  # the comparison covered the GPUs, not just their absence
        assert replayed.count("fleetscope_gpu_info{") == 8
    assert isinstance(replay_collectors(config, capture).get("ena").__dict__.get("_reader"), CapturedEnaReader) \
        or "ena" not in config.enabled_collectors()
    assert os.path.getsize(archive) < 512 * 1024
