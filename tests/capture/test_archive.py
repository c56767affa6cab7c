"""What a capture holds and what it must never hold; opening one is as careful as writing one."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest
import yaml

from fleetscope.capture.archive import (
    FORMAT_VERSION,
    TOP,
    CaptureError,
    open_capture,
    render,
    take_snapshot,
    write_archive,
    write_mapping,
)
from fleetscope.capture.redact import Redactor
from fleetscope_sim.kernel_tree import SysfsTree
from fleetscope_sim.nvml_fake import uninstall
from tests.capture.nodes import FixtureNode, ena_reading
from tests.fixtures import make_fixtures as mk

HOSTNAME = "ip-10-20-30-40.us-west-2.compute.internal"
ADDRESS = "10.20.30.40"
INSTANCE_ID = "i-0123456789abcdef0"
FIB_TRIE = f"""Main:
  +-- 0.0.0.0/0 3 0 5
     |-- {ADDRESS}
        /32 host LOCAL
     |-- 10.20.30.255
        /32 link BROADCAST
"""


@pytest.fixture(autouse=True)
def no_fake_left() -> object:
    yield
    uninstall()


def identified_node(root: str) -> FixtureNode:
    """The p5 fixture as a node with a name, an address and an instance id the capture must keep out."""
    node = FixtureNode.build(root, "p5", "h100_8x_healthy")
    proc = node.settings["path.procfs"]
    os.makedirs(os.path.join(proc, "sys", "kernel"))
    with open(os.path.join(proc, "sys", "kernel", "hostname"), "w") as handle:
        handle.write(HOSTNAME + "\n")
    with open(os.path.join(proc, "net", "fib_trie"), "w") as handle:
        handle.write(FIB_TRIE)
    dmi = os.path.join(node.settings["path.sysfs"], "devices", "virtual", "dmi", "id")
    os.makedirs(dmi)
    for name, value in (("board_asset_tag", INSTANCE_ID), ("product_name", "p5.48xlarge"),
                        ("sys_vendor", "Amazon EC2")):
        with open(os.path.join(dmi, name), "w") as handle:
            handle.write(value + "\n")
    with open(node.settings["path.kmsg"], "a") as handle:
        handle.write(f"6,2001,9000000,-;NVRM: nvidia-peermem: peer {ADDRESS} ({HOSTNAME}) ok, name=secret_trainer\n")
        handle.write(f"6,2002,9000001,-;NVRM: node {INSTANCE_ID} mac 0a:3f:5c:21:7e:01\n")
    return node


def capture(node: FixtureNode, **kwargs: object) -> object:
    fake = node.fake()
    try:
        return take_snapshot(node.config, ena_reader=ena_reading, nvml_timeout=10.0, gpm_interval=0.05,
                             event_wait=0.05, **kwargs)  # type: ignore[arg-type]
    finally:
        if fake is not None:
            fake.release()
        uninstall()


def members(path: str) -> dict[str, bytes | str | None]:
    """name -> bytes (file), link text, or None (directory)."""
    out: dict[str, bytes | str | None] = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                out[member.name] = extracted.read()
            else:
                out[member.name] = member.linkname if member.issym() else None
    return out


def test_nothing_identifying_survives_and_the_rest_is_what_the_readers_read(tmp_path) -> None:
    node = identified_node(str(tmp_path / "node"))
    snapshot = capture(node)
    rendered = render(snapshot)
    archive = str(tmp_path / "capture.tar.gz")
    write_archive(rendered, archive)
    content = members(archive)
    blob = b"\n".join(v if isinstance(v, bytes) else (v or "").encode() for v in content.values())
    blob += "\n".join(content).encode()
    originals = [HOSTNAME, "ip-10-20-30-40", ADDRESS, "10-20-30-40", INSTANCE_ID, "secret_trainer",
                 *(mac for _, _, _, _, mac in mk.P5_NICS.values() if mac != "00:00:00:00:00:00"),
                 "1654922000000", "GPU-11111111-2222-3333-4444-555555555555"]
    guid = Path(node.settings["path.sysfs"], "class", "infiniband", "rdmap79s0", "node_guid").read_text()
    uuid = snapshot.nvml.scenario["gpus"][0]["uuid"]  # the fake's, as NVML gave it
    for original in [*originals, guid.strip(), uuid]:
        assert original.lower().encode() not in blob.lower(), original
    manifest = json.loads(content[f"{TOP}/manifest.json"])
    assert manifest["format_version"] == FORMAT_VERSION and manifest["node"]["product_name"] == "p5.48xlarge"
    assert manifest["settings"]["collector.steps"] is False
    replaced = manifest["redaction"]["replaced"]
    assert replaced["gpu_uuid"] >= 8 and replaced["gpu_serial"] >= 8 and replaced["node_guid"] == 33
    assert replaced["hostname"] >= 1 and replaced["ipv4"] >= 1 and replaced["host_id"] == 1
    # only the readers' subtrees: no DMI, no procfs beyond the TCP counters and the boot time
    allowed = ("sys/class/infiniband", "sys/class/net", "sys/devices/pci", "sys/devices/virtual/net",
               "sys/bus/pci/devices", "proc/net/snmp", "proc/net/netstat", "proc/stat", "kmsg", "nvml.yaml",
               "ena.json", "manifest.json", "README.txt")
    for name in content:
        relative = name[len(TOP) + 1:]
        assert any(relative.startswith(root) or root.startswith(relative + "/") or not relative
                   for root in allowed), relative
    assert f"{TOP}/proc/net/fib_trie" not in content and not any("dmi" in name for name in content)
    assert content[f"{TOP}/proc/stat"] == b"btime 1700000000\n"
    kmsg = content[f"{TOP}/kmsg"].decode()
    assert "name=python3" in kmsg and "name=proc-" in kmsg  # common programs kept, others replaced
    # the same GPU serial in the kernel log and in NVML: one pseudonym
    serial = rendered.redactor.gpu_serial("1654922000000")
    scenario = yaml.safe_load(content[f"{TOP}/nvml.yaml"])
    assert f"Serial Number: {serial}" in kmsg and scenario["gpus"][0]["serial"] == serial


def test_every_form_of_the_nodes_identifiers_is_redacted(tmp_path) -> None:
    """Measured before (#30 item 3): each of these survived into the archive and the leak check passed."""
    node = identified_node(str(tmp_path / "node"))
    uuid = "11111111-2222-3333-4444-555555555555"  # GPU 0 of the scenario
    forms = {
        "short host name": "ip-10-20-30-40", "short host name, uppercase": "IP-10-20-30-40",
        "MAC, dashed": "0A-3F-5C-21-7E-01", "MAC, bare": "0a3f5c217e01", "MAC, dotted": "0a3f.5c21.7e01",
        "a peer's EC2 name": "ip-10-20-31-7", "a peer's MAC, dashed": "0a-3f-5c-99-88-77",
        "UUID, lowercase prefix": f"gpu-{uuid}", "UUID, bare": uuid,
        "serial without Serial Number:": "serial 1320921031911",
    }
    with open(node.settings["path.kmsg"], "a") as handle:
        for n, text in enumerate(forms.values()):
            handle.write(f"6,{3000 + n},9100000,-;NVRM: nvidia-peermem: {text} ok\n")
    rendered = render(capture(node))
    blob = b"\n".join(rendered.files.values()).lower()
    for kind, text in forms.items():
        assert text.lower().encode() not in blob, kind
    assert b"1320921031911" not in blob and b"10-20-31-7" not in blob


def test_a_value_left_unredacted_refuses_the_capture(tmp_path) -> None:
    node = identified_node(str(tmp_path / "node"))
    # a firmware string that happens to carry the host name: no rule redacts fw_ver, the final check must
    SysfsTree(node.settings["path.sysfs"]).rdma_device("rdmap79s0", "0000:4f:00.0", {}, {}, fw_ver=HOSTNAME)
    with pytest.raises(CaptureError, match="hostname"):
        render(capture(node))


def test_the_mapping_is_for_the_user_only(tmp_path) -> None:
    node = identified_node(str(tmp_path / "node"))
    rendered = render(capture(node))
    mapping = str(tmp_path / "mapping.json")
    write_mapping(rendered, mapping)
    assert stat.S_IMODE(os.stat(mapping).st_mode) == 0o600
    table = json.loads(Path(mapping).read_text())
    assert HOSTNAME in table["hostname"].values() and ADDRESS in table["ipv4"].values()


def test_archives_are_deterministic_and_pseudonyms_differ_between_captures(tmp_path) -> None:
    node = identified_node(str(tmp_path / "node"))
    snapshot = capture(node)
    rendered = render(snapshot, Redactor(key=b"k" * 32))
    first, second = str(tmp_path / "a.tar.gz"), str(tmp_path / "b.tar.gz")
    write_archive(rendered, first, mtime=1_800_000_000)
    write_archive(rendered, second, mtime=1_800_000_000)
    assert Path(first).read_bytes() == Path(second).read_bytes()
    other = render(snapshot, Redactor(key=b"x" * 32))
    assert rendered.files["sys/devices/pci0000:27/0000:27:00.0/net/ens32/address"] != \
        other.files["sys/devices/pci0000:27/0000:27:00.0/net/ens32/address"]


def test_refused_attributes_stay_refused_in_the_replay(tmp_path) -> None:
    node = FixtureNode.build(str(tmp_path / "node"), "malformed", None)
    rendered = render(capture(node, nvml=False))
    refused = rendered.manifest["contents"]["sys"]["refused"]
    rx_pkts = "sys/devices/pci0000:10/0000:10:1b.0/infiniband/rdmap16s27/ports/1/hw_counters/rx_pkts"
    assert refused[rx_pkts] == "EISDIR" and rx_pkts in rendered.dirs and rx_pkts not in rendered.files


def _tar(path: str, entries: list[tarfile.TarInfo], data: bytes = b"{}") -> None:
    with tarfile.open(path, "w:gz") as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)


def _file(name: str, data: bytes = b"{}") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


@pytest.mark.parametrize("entries, message", [
    ([_file("../evil")], "unexpected member"),
    ([_file("/etc/evil")], "unexpected member"),
    ([_file(f"{TOP}/manifest.json"), _link(f"{TOP}/sys/x", "../../../etc/passwd")], "outside the capture"),
    ([_file(f"{TOP}/manifest.json"), _link(f"{TOP}/sys/x", "/etc/passwd")], "outside the capture"),
])
def test_opening_refuses_archives_that_reach_outside(tmp_path, entries, message) -> None:
    path = str(tmp_path / "evil.tar.gz")
    _tar(path, entries)
    with pytest.raises(CaptureError, match=message):
        open_capture(path, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "etc")


def test_opening_names_a_newer_format_and_a_non_capture(tmp_path) -> None:
    newer = json.dumps({"format": "fleetscope-capture", "format_version": FORMAT_VERSION + 1}).encode()
    path = str(tmp_path / "newer.tar.gz")
    _tar(path, [_file(f"{TOP}/manifest.json", newer)], newer)
    with pytest.raises(CaptureError, match="newer than this fleetscope"):
        open_capture(path, str(tmp_path / "out"))
    with pytest.raises(CaptureError, match="cannot open"):
        open_capture(__file__, str(tmp_path / "out2"))


def test_a_lost_gpu_keeps_its_place_on_the_pci_bus(tmp_path) -> None:
    node = FixtureNode.build(str(tmp_path / "node"), "p5", "lost_gpu")
    scenario = capture(node).nvml.scenario  # type: ignore[attr-defined]
    assert scenario["lost"] == [3] and scenario["pci_buses"] == [0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA]
    assert scenario["description"] == "8x NVIDIA H100 80GB HBM3, as fleetscope capture found them"


def test_procfs_is_kept_at_the_paths_read_not_through_the_reader_s_own_pid(tmp_path) -> None:
    from fleetscope.capture.files import copy_procfs

    proc = tmp_path / "proc"
    (proc / "4242" / "net").mkdir(parents=True)
    (proc / "4242" / "net" / "snmp").write_text("Tcp: OutSegs\nTcp: 7\n")
    (proc / "self").symlink_to("4242")
    (proc / "net").symlink_to("self/net")
    (proc / "stat").write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n")
    copied = copy_procfs(str(proc))
    assert copied.files == {"net/snmp": b"Tcp: OutSegs\nTcp: 7\n", "stat": b"btime 1700000000\n"}
    assert copied.links == {} and copied.unreadable == {}
