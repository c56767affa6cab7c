"""Rank processes forked from one interpreter that has already imported torch.

A rank spends its first seconds importing: torch and its distributed stack cost about 5 CPU-s a process on
the suite's machine, the same in every rank, and the live tier's training run alone starts nine ranks at
once beside the gate. Here one fork server (multiprocessing's ``forkserver`` context, one per test process)
imports them once, and each rank is a fork of it: a process of its own (its own pid, session, environment,
working directory, log and exit status) that runs its script or module as ``python`` does, as
``__main__``, with torch already in memory. What a rank does after its imports, torch.distributed over gloo
included, is unchanged: nothing of torch runs in the server before it forks (no thread, no operator), which
is what makes a fork of it safe.

torchrun's elastic agent, where a test runs it, still starts its ranks itself, as it does in production.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.connection
import os
import runpy
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing import resource_tracker
from multiprocessing.context import ForkServerProcess

# What every rank imports before it does anything: torch, its process groups, the DDP and FSDP wrappers,
# the data loader, and the client. Frameworks a few tests add (transformers, Lightning) load in those ranks.
PRELOAD = ["torch", "torch.distributed", "torch.distributed.fsdp", "torch.nn.parallel", "torch.utils.data",
           "fleetscope.client"]


class Rank:
    """One forked rank, with the part of :class:`subprocess.Popen`'s surface the harnesses use, safe to wait
    for from several threads (the fork server sends a rank's exit status once, to whichever reads it first)."""

    def __init__(self, process: ForkServerProcess) -> None:
        self._process = process
        self._reading = threading.Lock()

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code (negative: the signal that ended it), None while it runs."""
        with self._reading:
            return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        multiprocessing.connection.wait([self._process.sentinel], timeout)
        code = self.returncode
        if code is None:
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        self._process.kill()


def launch(command: Sequence[str], env: Mapping[str, str], cwd: str, log: str) -> Rank:
    """What ``python COMMAND`` (``script.py args`` or ``-m module args``) would run, in ``cwd`` with exactly
    ``env``, stdin from /dev/null, stdout and stderr to ``log``, in a new session (killing its process group
    ends its DataLoader workers too)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # read when the server starts: on this process's first launch
    process = context.Process(target=_run, args=(list(command), dict(env), cwd, log), daemon=False)
    process.start()
    return Rank(process)


def _run(command: list[str], env: dict[str, str], cwd: str, log: str) -> None:
    os.setsid()
    stdin = os.open(os.devnull, os.O_RDONLY)
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(stdin, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(stdin)
    os.close(output)
    for stream in (sys.stdout, sys.stderr):  # each line in the log as it is written, as a rank killed leaves it
        stream.reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(env)
    # Its own resource tracker, started when it first needs one, as a new interpreter's, not the test process's that
    # the server passes on (which would report a killed rank's DataLoader semaphores as leaked at the session's end).
    tracker = resource_tracker._resource_tracker  # type: ignore[attr-defined]
    if tracker._fd is not None:
        os.close(tracker._fd)
        tracker._fd = tracker._pid = None
    os.chdir(cwd)
    code = 0
    try:
        if command[0] == "-m":
            sys.argv = command[1:]
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = command
            sys.path.insert(0, os.path.dirname(os.path.abspath(command[0])))  # as python puts a script's directory
            runpy.run_path(command[0], run_name="__main__")
    except SystemExit as exited:
        code = _exit_code(exited.code)
    except BaseException:
        traceback.print_exc()  # what the interpreter prints of an uncaught exception, and its exit code
        code = 1
    # Then what the interpreter does on its way out, which a fork's own end would skip: it waits for the threads
    # that are not daemons, runs the atexit handlers (the client pushes its last steps there, and a rank whose
    # peer died says so), flushes its streams.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_code(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives a Python process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
