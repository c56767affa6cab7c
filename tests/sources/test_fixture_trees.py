"""The committed fixture trees are exactly what tests/fixtures/make_fixtures.py generates."""

from __future__ import annotations

import os

import pytest

from fleetscope_sim.kernel_tree import rdma_pci_name
from tests.conftest import FIXTURES
from tests.fixtures import make_fixtures as mk


def snapshot(root: str) -> dict[str, tuple[str, str]]:
    """relative path -> ("link", target) | ("file", content) | ("dir", "")."""
    out: dict[str, tuple[str, str]] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if "__pycache__" in relative:
                continue
            if os.path.islink(path):
                out[relative] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[relative] = ("dir", "")
            else:
                with open(path, encoding="ascii") as handle:
                    out[relative] = ("file", handle.read())
    return out


@pytest.mark.parametrize("name", mk.TREES)
def test_committed_tree_matches_generator(name: str, tmp_path: object) -> None:
    generated = os.path.join(str(tmp_path), name)
    mk.BUILDERS[name](generated)
    committed = snapshot(os.path.join(FIXTURES, name))
    fresh = snapshot(generated)
    assert sorted(set(committed) ^ set(fresh)) == [], "rerun python3 tests/fixtures/make_fixtures.py"
    assert [p for p in fresh if committed[p] != fresh[p]] == []


def test_links_follow_the_kernel_layout() -> None:
    sysfs = os.path.join(FIXTURES, "p5", "sys")
    entry = os.path.join(sysfs, "class", "infiniband", "rdmap79s0")
    assert os.readlink(entry) == "../../devices/pci0000:4f/0000:4f:00.0/infiniband/rdmap79s0"
    device = os.path.join(entry, "device")
    assert os.readlink(device) == "../../../0000:4f:00.0"
    assert os.path.isfile(os.path.join(device, "vendor"))
    assert os.readlink(os.path.join(device, "driver")) == "../../../bus/pci/drivers/efa"
    assert os.path.samefile(os.path.join(sysfs, "bus", "pci", "devices", "0000:4f:00.0"), device)
    nic = os.path.join(sysfs, "class", "net", "ens32")
    assert os.readlink(nic) == "../../devices/pci0000:27/0000:27:00.0/net/ens32"
    assert os.readlink(os.path.join(sysfs, "class", "net", "lo")) == "../../devices/virtual/net/lo"


@pytest.mark.parametrize(
    "address, name",
    [
        ("0000:10:1b.0", "rdmap16s27"),
        ("0000:4f:00.0", "rdmap79s0"),
        ("0000:c9:00.0", "rdmap201s0"),
        ("0001:10:1b.0", "rdmaP1p16s27"),
        ("0000:10:1b.1", "rdmap16s27f1"),
    ],
)
def test_rdma_pci_name_is_decimal(address: str, name: str) -> None:
    assert rdma_pci_name(address) == name
