"""Where ``fleetscope capture`` writes, as root, in directories others may write to (#30 item 2).

Measured before: ``-o`` at a character device replaced the device node with
a regular file; a symlink planted at the predictable ``<out>.<pid>.tmp`` made
root overwrite its target; a full disk or a directory as the output ended in
a traceback and left the ``.tmp`` behind. Every case here refuses with one
line and leaves what was there as it was.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetscope.capture import archive
from fleetscope.capture.archive import CaptureError, Rendered, render, write_archive, write_mapping
from fleetscope_sim.nvml_fake import uninstall
from tests.capture.nodes import FixtureNode
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rendered]:
    node = FixtureNode.build(str(tmp_path_factory.mktemp("node")), "p4d", None)
    try:
        yield render(archive.take_snapshot(node.config, nvml=False))
    finally:
        uninstall()


def leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(set(os.listdir(directory)) - keep)


def special_node(path: Path) -> str:
    """A character device like /dev/null where the kernel lets us make one, else a FIFO: never a real device."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return "character device"
    except (PermissionError, OSError):
        os.mkfifo(path)
        return "FIFO"


def test_a_device_node_or_fifo_as_output_is_refused_and_left_alone(tmp_path: Path, rendered: Rendered) -> None:
    target = tmp_path / "full"
    kind = special_node(target)
    before = os.lstat(target)
    with pytest.raises(CaptureError, match="not a regular file"):
        write_archive(rendered, str(target))
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev), kind
    assert leftovers(tmp_path, {"full"}) == []


def test_a_planted_temporary_symlink_is_not_followed(tmp_path: Path, rendered: Rendered) -> None:
    """Another user plants ``<out>.<pid>.tmp`` (and any other name it can guess) towards a root-owned file."""
    victim = tmp_path / "shadow"
    victim.write_text("root:x:0:0\n")
    out = tmp_path / "capture.tar.gz"
    planted = {f"capture.tar.gz.{os.getpid()}.tmp", "capture.tar.gz.tmp", ".capture.tar.gz.tmp"}
    for name in planted:
        os.symlink(victim, tmp_path / name)
    write_archive(rendered, str(out))
    assert victim.read_text() == "root:x:0:0\n"
    assert all((tmp_path / name).is_symlink() for name in planted)
    assert out.stat().st_size > 0 and leftovers(tmp_path, {"shadow", "capture.tar.gz", *planted}) == []


def test_a_symlink_as_output_is_refused(tmp_path: Path, rendered: Rendered) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / "out.tar.gz")
    with pytest.raises(CaptureError, match="symbolic link"):
        write_archive(rendered, str(tmp_path / "out.tar.gz"))
    assert victim.read_text() == "keep" and (tmp_path / "out.tar.gz").is_symlink()


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path: Path, rendered: Rendered,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "capture.tar.gz"
    out.write_bytes(b"the previous capture")
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.fstat(fd).st_size > 1000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data[:512])

    monkeypatch.setattr(archive.os, "write", full)
    with pytest.raises(CaptureError, match="No space left on device"):
        write_archive(rendered, str(out))
    assert out.read_bytes() == b"the previous capture"
    assert leftovers(tmp_path, {"capture.tar.gz"}) == []


def test_the_archive_is_readable_and_the_mapping_owner_only_even_over_an_old_file(
        tmp_path: Path, rendered: Rendered) -> None:
    out, mapping = tmp_path / "capture.tar.gz", tmp_path / "mapping.json"
    out.write_text("old")
    mapping.write_text("old")
    mapping.chmod(0o644)  # an old table somebody made readable: the new one must not inherit that
    write_archive(rendered, str(out))
    write_mapping(rendered, str(mapping))
    assert stat.S_IMODE(out.stat().st_mode) == 0o644 & ~current_umask()
    assert stat.S_IMODE(mapping.stat().st_mode) == 0o600 and mapping.read_text().startswith("{")
    os.symlink(tmp_path / "elsewhere", tmp_path / "linked.json")
    with pytest.raises(CaptureError, match="symbolic link"):
        write_mapping(rendered, str(tmp_path / "linked.json"))
    assert not (tmp_path / "elsewhere").exists()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_command_names_a_directory_or_device_output_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["PYTHONPATH"] = os.pathsep.join((os.path.join(ROOT, "exporter"), os.path.join(ROOT, "sim")))
    node = FixtureNode.build(str(tmp_path / "node"), "p4d", None)
    flags = [f"--{key}={value}" for key, value in node.settings.items() if key != "collector.steps"]
    (tmp_path / "out").mkdir()
    special_node(tmp_path / "dev")
    for output, message in (("out", "is a directory"), ("dev", "not a regular file"),
                            ("missing/x.tar.gz", "No such file or directory")):
        done = subprocess.run([sys.executable, "-m", "fleetscope", "capture", *flags, "--no-collector.steps",
                               "--no-collector.ena", "--no-nvml", "-o", str(tmp_path / output)],
                              capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False)
        assert done.returncode == 1, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr
    assert os.listdir(tmp_path / "out") == [] and leftovers(tmp_path, {"out", "dev", "node"}) == []
