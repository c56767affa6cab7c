from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetscope.sources.fs import SYSFS_READ_LIMIT, Root, Unreadable


def test_read_attrs_reads_each_file_once_bounded_and_sorted(tmp_path: Path) -> None:
    counters = tmp_path / "hw_counters"
    counters.mkdir()
    (counters / "tx_bytes").write_bytes(b"12\n")
    (counters / "endless").write_bytes(b"7" * (3 * SYSFS_READ_LIMIT))  # a driver that streams: one page
    os.mkfifo(counters / "a_fifo")  # no writer: the non-blocking open reads it as empty, never waits
    (counters / "subdir").mkdir()  # reading a directory fails (EISDIR): that name only
    contents = Root(str(tmp_path)).read_attrs("hw_counters")
    assert contents == {"a_fifo": b"", "endless": b"7" * SYSFS_READ_LIMIT, "subdir": None, "tx_bytes": b"12\n"}
    assert list(contents) == sorted(contents)


def test_read_attrs_absent_empty_and_not_a_directory(tmp_path: Path) -> None:
    root = Root(str(tmp_path))
    assert root.read_attrs("missing") is None
    (tmp_path / "empty").mkdir()
    assert root.read_attrs("empty") == {}
    (tmp_path / "file").write_text("1\n")
    assert root.read_attrs("file") == {} and root.listdir("file") == []  # as listdir sees it
    assert root.read_attrs("file", "below") is None


def test_read_attrs_on_a_directory_that_cannot_be_opened_raises(tmp_path: Path) -> None:
    os.symlink("loop", tmp_path / "loop")
    with pytest.raises(Unreadable):
        Root(str(tmp_path)).read_attrs("loop")
