from __future__ import annotations

import os

from fleetscope.sources.fs import Root
from fleetscope.sources.pci import list_gpus
from fleetscope_sim.nvml_fake import load_scenario, write_sysfs


def write(path: str, **files: str) -> None:
    os.makedirs(path, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(path, name), "w") as handle:
            handle.write(text + "\n")


def test_counts_nvidia_display_controllers_only(tmp_path) -> None:
    devices = tmp_path / "bus" / "pci" / "devices"
    write(str(devices / "0000:53:00.0"), vendor="0x10de", device="0x2330", **{"class": "0x030200"})
    write(str(devices / "0000:0a:00.0"), vendor="0x10de", device="0x20b0", **{"class": "0x030000"})  # VGA class
    write(str(devices / "0000:07:00.0"), vendor="0x10de", device="0x22a3", **{"class": "0x068000"})  # NVSwitch
    write(str(devices / "0000:53:00.1"), vendor="0x10de", device="0x22ba", **{"class": "0x040300"})  # HDMI audio
    write(str(devices / "0000:00:05.0"), vendor="0x1d0f", device="0xec20", **{"class": "0x020000"})  # ENA
    write(str(devices / "0000:0b:00.0"), vendor="garbage", **{"class": "0x030200"})  # unreadable vendor
    gpus = list_gpus(Root(str(tmp_path)))
    assert [(g.address, g.device_id) for g in gpus] == [("0000:0a:00.0", 0x20B0), ("0000:53:00.0", 0x2330)]


def test_fake_node_tree_matches_its_gpus(tmp_path) -> None:
    fake = load_scenario("a100_8x")
    write_sysfs(fake, str(tmp_path))
    gpus = list_gpus(Root(str(tmp_path)))
    assert [g.address for g in gpus] == [gpu.sysfs_address for gpu in fake.gpus]


def test_a_gpu_gone_from_the_bus_is_not_counted(tmp_path) -> None:
    fake = load_scenario("h100_8x_healthy")
    write_sysfs(fake, str(tmp_path), present=[0, 1, 2, 4, 5, 6, 7])
    assert len(list_gpus(Root(str(tmp_path)))) == 7


def test_no_sysfs_means_no_gpus(tmp_path) -> None:
    assert list_gpus(Root(str(tmp_path / "absent"))) == []
