"""Is a pushing rank's process still alive? Read from the node's procfs (``path.procfs``).

A rank reports its pid and its start time (clock ticks after boot, field 22
of ``/proc/<pid>/stat``), as it sees them. The start time is the same in every
PID namespace, so the pair names the process even from outside its container:

* same namespace as the daemon (Slurm, systemd): ``<procfs>/<pid>/stat`` has
  that start time;
* a container (the DaemonSet reads the host's ``/proc`` with ``hostPID``): the
  host process with that start time whose ``NSpid`` ends in the rank's pid.
  Found by one scan of the process table, remembered, and looked up directly
  after that.

A process once found that is no longer there, is a zombie its parent has not
reaped yet, or whose pid now belongs to a process started at another time is
gone: the rank died. A process never
found (a daemon that cannot see the rank's PID namespace, or a simulated
procfs) is unknown, never reported as gone. Knows no metric names.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from fleetscope.wire import process_state

RESCAN_AFTER = 30.0  # seconds before looking again for a process not found yet


def _running(pid: int | str, start: int, procfs: str) -> bool:
    """The process ``pid`` exists, started at ``start``, and has not exited (a zombie has)."""
    state = process_state(pid, procfs)
    return state is not None and state[1] == start and state[0] not in ("Z", "X", "x")


def _namespace_pid(procfs: str, pid: str) -> int | None:
    """The innermost PID namespace's pid of a process (the last ``NSpid`` field), if the kernel says."""
    try:
        with open(os.path.join(procfs, pid, "status"), "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class ProcessTable:
    """Liveness of (pid, start time) pairs as the pushing processes stated them."""

    def __init__(self, procfs: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._procfs = procfs
        self._clock = clock
        self._found: dict[tuple[int, int], int] = {}  # (pid, start) -> pid in the daemon's procfs
        self._looked: dict[tuple[int, int], float] = {}  # when a process not found yet was last looked for

    def alive(self, pid: int, start: int) -> bool | None:
        """True: running. False: it was seen and is gone. None: this daemon cannot tell."""
        key = (pid, start)
        host_pid = self._found.get(key)
        if host_pid is not None:
            return _running(host_pid, start, self._procfs)
        if _running(pid, start, self._procfs):
            self._found[key] = pid
            return True
        now = self._clock()
        if now - self._looked.get(key, -RESCAN_AFTER) < RESCAN_AFTER:
            return None
        self._looked[key] = now
        host_pid = self._scan(pid, start)
        if host_pid is None:
            return None
        self._found[key] = host_pid
        self._looked.pop(key, None)
        return True

    def _scan(self, pid: int, start: int) -> int | None:
        try:
            entries = [name for name in os.listdir(self._procfs) if name.isdigit()]
        except OSError:
            return None
        for name in entries:
            if _running(name, start, self._procfs) and _namespace_pid(self._procfs, name) == pid:
                return int(name)
        return None

    def forget(self, keep: set[tuple[int, int]]) -> None:
        """Drop what is known about processes no tracked rank reports any more."""
        for table in (self._found, self._looked):
            for key in [k for k in table if k not in keep]:
                del table[key]
