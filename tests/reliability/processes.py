"""Real servers for the reliability tests, all on 127.0.0.1: the daemon (``fleetscope serve``) and a Pushgateway.

Each is a process this test started, stopped by its own pid; the daemon's
memory (VmRSS and its peak VmHWM), open files and log size are read from
/proc, as an operator would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import FIXTURES, ROOT, free_port, require_binary

P5 = os.path.join(FIXTURES, "p5")
# The DaemonSet's memory limit (deploy/kubernetes/base/daemonset.yaml, docs/benchmarks.md): every flood
# must leave the daemon's peak RSS below it, with room to spare.
MEMORY_LIMIT_BYTES = 192 * 1024 * 1024


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 30) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def _flag(key: str, value: str) -> str:
    if value in ("true", "false"):
        return f"--{key}" if value == "true" else f"--no-{key}"
    return f"--{key}={value}"


@dataclass
class Daemon:
    """``python -m fleetscope serve`` on a free port of 127.0.0.1, reading the p5 fixture tree."""

    log_dir: Path
    flags: dict[str, str] = field(default_factory=dict)
    open_files: int | None = None  # soft and hard RLIMIT_NOFILE of the daemon, if set
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"daemon-{self.port}.log"

    def start(self) -> Daemon:
        self.port = self.port or free_port()
        settings = {"web.listen-address": f"127.0.0.1:{self.port}", "path.sysfs": os.path.join(P5, "sys"),
                    "path.procfs": os.path.join(P5, "proc"), "collector.gpu": "false", "collector.ena": "false",
                    "collector.nccl": "false", **self.flags}
        argv = [sys.executable, "-m", "fleetscope", "serve", *(_flag(k, v) for k, v in settings.items())]
        if self.open_files is not None:  # util-linux's prlimit sets the limit, then execs the daemon
            argv = ["prlimit", f"--nofile={self.open_files}:{self.open_files}", "--", *argv]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
        env["PYTHONPATH"] = os.path.join(ROOT, "exporter")
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it for its whole life
        self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=log, cwd=ROOT)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon exited: {self.log_path.read_text()[-2000:]}")
            try:
                if http("GET", self.url + "/healthz", timeout=1)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("daemon did not start")

    def status(self, field_name: str) -> int:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(field_name)

    def rss(self) -> int:
        return self.status("VmRSS")

    def peak_rss(self) -> int:
        return self.status("VmHWM")

    def open_fds(self) -> int:
        assert self.process is not None
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def get(self, path: str, timeout: float = 30) -> tuple[float, int, bytes]:
        """(seconds, status, body) of one GET."""
        started = time.monotonic()
        status, body, _ = http("GET", self.url + path, timeout=timeout)
        return time.monotonic() - started, status, body

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@dataclass
class Pushgateway:
    """The real ``prometheus-pushgateway``, in memory only (Debian's build persists to a shared file by default)."""

    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Pushgateway:
        binary = require_binary("prometheus-pushgateway")
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, f"--web.listen-address=127.0.0.1:{self.port}", "--persistence.file=", "--log.level=error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if http("GET", self.url + "/-/ready", timeout=1)[0] == 200:
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("pushgateway did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
