"""Readers run as the daemon runs in the DaemonSet (root, every capability dropped) or as nobody, against a real
process of another user (#30 item 7). Needs root to start the processes as those users."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

NOBODY = 65534
TRAINER = 1000  # the training job's user

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as other users (CI runs as root)")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_all_capabilities() -> None:
    """``capabilities: drop: [ALL]`` for this process: uid 0, no capability."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def as_reader(who: str, work: Callable[[], Any]) -> Any:
    """``work()`` in a forked child running as ``who`` ("nobody", or "root-drop-all"); its JSON result back.

    A fork, not a new interpreter: the child needs no access to the interpreter's files, only to what it reads.
    """
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            if who == "nobody":
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            else:
                drop_all_capabilities()
            result = {"value": work()}
        except BaseException as exc:  # reported to the parent, which fails the test
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(result, default=repr).encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(child, 0)
    result = json.loads(b"".join(chunks))
    assert "error" not in result, result["error"]
    return result["value"]


@contextmanager
def trainer_process(environ: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A real process of another user (the training job's), with ``environ``."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    process = subprocess.Popen([sleep, "60"], env=environ, user=TRAINER, group=TRAINER, extra_groups=[])
    try:
        yield process
    finally:
        process.kill()
        process.wait(10)


@contextmanager
def public_directory() -> Iterator[str]:
    """A scratch directory an unprivileged reader can enter (pytest's tmp_path is root's, mode 0700)."""
    path = tempfile.mkdtemp(prefix="fleetscope-unprivileged-")
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
