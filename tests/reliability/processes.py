"""Real servers for the reliability tests, all on 127.0.0.1: the daemon (``fleetscope serve``) and a Pushgateway.

Both are :mod:`fleetscope_sim.harness`'s processes, on ports the kernel chose; the
daemon's memory (VmRSS and its peak VmHWM) and open files are read from /proc, as
an operator would.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from fleetscope_sim import harness
from tests.conftest import FIXTURES, ROOT, require_binary

P5 = os.path.join(FIXTURES, "p5")
# The DaemonSet's memory limit (deploy/kubernetes/base/daemonset.yaml, docs/benchmarks.md): every flood
# must leave the daemon's peak RSS below it, with room to spare.
MEMORY_LIMIT_BYTES = 192 * 1024 * 1024
# How long one request may take: a guard against a daemon that never answers, long enough that a loaded machine
# (these tests run beside others on 2 cores) does not trip it. How fast the daemon answers is not asserted here.
REQUEST_TIMEOUT = 120.0


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = REQUEST_TIMEOUT) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


class Daemon(harness.Daemon):
    """``python -m fleetscope serve`` on 127.0.0.1:0 (the harness's), reading the p5 fixture tree."""

    @classmethod
    def on_p5(cls, log_dir: Path, flags: dict[str, str] | None = None, open_files: int | None = None) -> Daemon:
        """``open_files``: its soft and hard RLIMIT_NOFILE, set by util-linux ``prlimit``, which then execs it."""
        settings = {"path.sysfs": os.path.join(P5, "sys"), "path.procfs": os.path.join(P5, "proc"),
                    "collector.gpu": "false", "collector.ena": "false", "collector.nccl": "false", **(flags or {})}
        prefix = () if open_files is None else ("prlimit", f"--nofile={open_files}:{open_files}", "--")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
        env["PYTHONPATH"] = os.path.join(ROOT, "exporter")
        made = cls.serve(log_dir, settings, name=f"daemon-{len(list(log_dir.glob('daemon-*.log')))}", env=env,
                         prefix=prefix)
        made.cwd = ROOT
        return made

    def start(self, timeout: float = harness.READY_TIMEOUT) -> Daemon:
        super().start(timeout)
        return self

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def cpu_seconds(self) -> float:
        """User and system CPU time the daemon has used (/proc/PID/stat), all its threads."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def get(self, path: str, timeout: float = REQUEST_TIMEOUT) -> tuple[float, int, bytes]:
        """(seconds, status, body) of one GET."""
        started = time.monotonic()
        status, body, _ = http("GET", self.url + path, timeout=timeout)
        return time.monotonic() - started, status, body


class Pushgateway(harness.Pushgateway):
    """The real ``prometheus-pushgateway``, in memory only (Debian's build persists to a shared file by default)."""

    def __init__(self, workdir: Path) -> None:
        require_binary("prometheus-pushgateway")
        super().__init__(workdir, extra_args=("--persistence.file=",))
