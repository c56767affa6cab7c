"""The server processes that the simulator, the tests and the benchmarks start, and one way to wait for them.

:class:`Daemon` is a fleetscope daemon (``fleetscope serve``, or the simulator's ``simulate-node``);
:class:`Prometheus`, :class:`Alertmanager` and :class:`Pushgateway` are the distribution's binaries.
Each binds port 0 and the harness reads back the address it bound: the daemon writes it to its
``--web.ready-file``, and the Prometheus servers log it (``msg="Listening on" address=...``). No port is
probed, so none can be taken by someone else between a probe and a bind.

Each process is this harness's own, started with its output in a log file and stopped by its pid.
:func:`eventually` is the one wait: a condition polled until it holds or a deadline passes.

Standard library only (and ``localhttp``), so ``fleetscope demo`` runs on a plain ``pip install``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fleetscope_sim.localhttp import answers_ok, get_json

T = TypeVar("T")

# How long a server may take from its start to answering "ready". A daemon imports FastAPI and runs every
# collector once first: seconds, more on a loaded machine.
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 15.0
LOOPBACK = "127.0.0.1"


def eventually(predicate: Callable[[], T | None], timeout: float, what: str = "", interval: float = 0.1) -> T:
    """``predicate()``'s first truthy value, polled every ``interval`` s; TimeoutError after ``timeout`` s.

    An exception the predicate raises is not swallowed: a condition that cannot be evaluated is a failure,
    not a reason to wait longer."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout:g} s: {what or getattr(predicate, '__name__', predicate)}")
        time.sleep(interval)


def flag(key: str, value: Any) -> str:
    """A command-line flag as fleetscope's settings take it: ``--key=value``, ``--key`` / ``--no-key`` for booleans."""
    if isinstance(value, bool) or value in ("true", "false"):
        return f"--{key}" if value in (True, "true") else f"--no-{key}"
    return f"--{key}={value}"


@dataclass
class Process:
    """A server process started by this harness; stdout and stderr go to ``log_path``."""

    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.log_path.stem

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(list(self.argv), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=None if self.env is None else dict(self.env),
                                            cwd=self.cwd)

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} not started"
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_running(self) -> None:
        """Raise, with the end of its log, if the process has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}; its log ({self.log_path}) ends:\n"
                               f"{self.log()[-3000:]}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def proc_status(self, key: str) -> int:
        """A byte count from /proc/PID/status (``VmRSS``, ``VmHWM``), as an operator would read it."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def rss(self) -> int:
        return self.proc_status("VmRSS")

    def peak_rss(self) -> int:
        return self.proc_status("VmHWM")

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s; the exit status (None if never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@dataclass
class Daemon(Process):
    """A fleetscope daemon listening on 127.0.0.1:0; :attr:`addresses` are the ones it bound, by listener."""

    ready_file: Path = Path()
    addresses: dict[str, str] = field(default_factory=dict)

    @classmethod
    def serve(cls, workdir: str | Path, settings: Mapping[str, Any] | None = None, name: str = "daemon",
              env: Mapping[str, str] | None = None, prefix: Sequence[str] = ()) -> Daemon:
        """``fleetscope serve`` with ``settings`` as flags (a ``push.listen-address`` of ``127.0.0.1:0`` gets
        a push listener of its own). ``prefix`` goes before the command (``prlimit --nofile=...``)."""
        workdir = Path(workdir)
        ready = workdir / f"{name}.ready"
        flags = {"web.listen-address": f"{LOOPBACK}:0", **(settings or {}), "web.ready-file": str(ready)}
        argv = [*prefix, sys.executable, "-m", "fleetscope", "serve", *(flag(k, v) for k, v in flags.items())]
        return cls(argv, workdir / f"{name}.log", env=_without_fleetscope_variables(env), ready_file=ready)

    @classmethod
    def simulated_node(cls, workdir: str | Path, root: str, interval: float, name: str,
                       settings: Sequence[tuple[str, Any]] = (), listen: str = f"{LOOPBACK}:0") -> Daemon:
        """``fleetscope simulate-node`` serving the simulated node tree under ``root``."""
        workdir = Path(workdir)
        ready = workdir / f"{name}.ready"
        argv = [sys.executable, "-m", "fleetscope", "simulate-node", "--root", root, "--listen", listen,
                "--interval", str(interval), *(f"--set={key}={value}" for key, value in settings),
                f"--set=web.ready-file={ready}"]
        return cls(argv, workdir / f"{name}.log", ready_file=ready)

    def start(self, timeout: float = READY_TIMEOUT) -> Daemon:
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ready_file.unlink()  # a file left by an earlier run names ports that are not this daemon's
        super().spawn()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> Daemon:
        """Once it has bound its listeners (its ready file) and every collector has run once (``/readyz``)."""
        deadline = time.monotonic() + timeout
        self.addresses = eventually(self._bound, timeout, f"{self.name} to write {self.ready_file}")
        eventually(lambda: self._running_and(lambda: answers_ok(self.url + "/readyz")),
                   max(0.0, deadline - time.monotonic()), f"{self.name}'s /readyz to answer 200 ({self.log_path})")
        return self

    def _running_and(self, condition: Callable[[], bool]) -> bool:
        self.check_running()
        return condition()

    def _bound(self) -> dict[str, str] | None:
        self.check_running()
        try:
            return dict(json.loads(self.ready_file.read_text()))
        except FileNotFoundError:
            return None

    @property
    def address(self) -> str:
        return self.addresses["main"]

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def push_url(self) -> str:
        """Where the push API is: its own listener when it has one, else the main one."""
        return f"http://{self.addresses.get('push', self.address)}"


LISTENING = re.compile(r'msg="Listening on" address=(\S+)')


@dataclass
class GoServer(Process):
    """A Prometheus-project server (exporter-toolkit): it logs the address it bound once it listens."""

    ready_path: str = "/-/ready"
    address: str = ""
    log_offset: int = 0  # where this start's lines begin: a log reused by an earlier run names that run's address

    def spawn(self) -> None:
        try:
            self.log_offset = self.log_path.stat().st_size
        except FileNotFoundError:
            self.log_offset = 0
        super().spawn()

    def start(self, timeout: float = READY_TIMEOUT) -> GoServer:
        self.spawn()
        return self.wait_ready(timeout)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> GoServer:
        """Once it has logged the address it bound and answers ``ready_path``."""
        deadline = time.monotonic() + timeout
        self.address = eventually(self._bound, timeout, f"{self.name} to log its address ({self.log_path})")
        eventually(self._answers, max(0.0, deadline - time.monotonic()), f"{self.name} to answer {self.ready_path}")
        return self

    def _bound(self) -> str | None:
        self.check_running()
        with open(self.log_path, "rb") as log:
            log.seek(self.log_offset)
            found = LISTENING.search(log.read().decode(errors="replace"))
        return found.group(1) if found else None

    def _answers(self) -> bool:
        self.check_running()
        return answers_ok(self.url + self.ready_path)

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def url(self) -> str:
        return f"http://{self.address}"


def find_binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError(f"{names[0]} is not installed (Debian: apt-get install {names[0]})")


class Prometheus(GoServer):
    """A Prometheus server on a fresh data directory under ``workdir``, with :meth:`query` and friends."""

    def __init__(self, workdir: str | Path, listen: str = f"{LOOPBACK}:0", extra_args: Sequence[str] = (),
                 retention: str = "1d", binary: str | None = None) -> None:
        self.workdir = Path(workdir)
        super().__init__([], self.workdir / "prometheus.log")
        self.listen = listen
        self.extra_args = tuple(extra_args)
        self.retention = retention
        self.binary = binary  # None: the one on PATH

    def start(self, config: Mapping[str, Any] | None = None, timeout: float = READY_TIMEOUT) -> Prometheus:  # type: ignore[override]
        import yaml

        binary = self.binary or find_binary("prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(dict(config or {}), sort_keys=False))
        self.argv = [binary, f"--config.file={config_path}", f"--storage.tsdb.path={self.workdir / 'data'}",
                     f"--web.listen-address={self.listen}", f"--storage.tsdb.retention.time={self.retention}",
                     *self.extra_args]
        super().start(timeout)
        return self

    def api(self, path: str, **params: str) -> Any:
        body = get_json(f"{self.url}{path}", timeout=10.0, params=params)
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body}")
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing)."""
        return list(self.api("/api/v1/alerts")["alerts"])

    def firing(self) -> list[dict[str, Any]]:
        return [alert for alert in self.alerts() if alert["state"] == "firing"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/query", query=expr)["result"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/rules")["groups"])

    def targets_up(self) -> dict[str, bool]:
        return {t["labels"]["instance"]: t["health"] == "up" for t in self.api("/api/v1/targets")["activeTargets"]}


class Alertmanager(GoServer):
    """An Alertmanager that routes every alert to a receiver that sends nothing (what arrived is in its API)."""

    def __init__(self, workdir: str | Path, listen: str = f"{LOOPBACK}:0") -> None:
        self.workdir = Path(workdir)
        super().__init__([], self.workdir / "alertmanager.log")
        self.listen = listen

    def start(self, timeout: float = READY_TIMEOUT) -> Alertmanager:
        import yaml

        binary = find_binary("prometheus-alertmanager", "alertmanager")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump({
            "route": {"receiver": "log", "group_by": ["alertname", "training_job", "instance"],
                      "group_wait": "5s", "group_interval": "30s", "repeat_interval": "4h"},
            "receivers": [{"name": "log"}],
        }, sort_keys=False))
        self.argv = [binary, f"--config.file={config_path}", f"--storage.path={self.workdir / 'data'}",
                     f"--web.listen-address={self.listen}", "--cluster.listen-address="]
        super().start(timeout)
        return self


class Pushgateway(GoServer):
    """The Prometheus Pushgateway, keeping what it is sent in memory."""

    def __init__(self, workdir: str | Path, listen: str = f"{LOOPBACK}:0", extra_args: Sequence[str] = (),
                 binary: str | None = None) -> None:
        super().__init__([], Path(workdir) / "pushgateway.log")
        self.listen = listen
        self.extra_args = tuple(extra_args)
        self.binary = binary  # None: the one on PATH

    def spawn(self) -> None:
        binary = self.binary or find_binary("prometheus-pushgateway", "pushgateway")
        self.argv = [binary, f"--web.listen-address={self.listen}", *self.extra_args]
        super().spawn()

    def start(self, timeout: float = READY_TIMEOUT) -> Pushgateway:
        super().start(timeout)
        return self


def _without_fleetscope_variables(env: Mapping[str, str] | None) -> dict[str, str]:
    """The environment for a daemon: the caller's, or this process's without any FLEETSCOPE_* setting."""
    if env is not None:
        return dict(env)
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}

