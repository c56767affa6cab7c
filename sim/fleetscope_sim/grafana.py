"""Grafana for the demo, when a Grafana server is installed.

The server is the one on PATH (``grafana`` with its ``server`` subcommand, or the older
``grafana-server``), run from its own home directory (``conf/defaults.ini``) with every writable
path in the demo's work directory. It is provisioned from the repository's ``dashboards/``: the
shipped provisioning files with the datasource pointed at the demo's Prometheus, and the shipped
dashboard JSON. Without Grafana the demo names the ``docker compose`` command that gives the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetscope_sim.harness import eventually
from fleetscope_sim.localhttp import answers_ok

BINARIES = ("grafana", "grafana-server")
# Where packages put Grafana's home: Debian/RPM packages, a /usr/local or Homebrew install.
HOMES = ("/usr/share/grafana", "/usr/local/share/grafana", "/opt/homebrew/share/grafana")
COMPOSE_HINT = "docker compose up --build"


@dataclass(frozen=True)
class GrafanaInstall:
    binary: str
    home: str | None  # None: a binary without its home (conf/defaults.ini) next to it

    def command(self) -> list[str]:
        server = [self.binary, "server"] if os.path.basename(self.binary) == "grafana" else [self.binary]
        return [*server, f"--homepath={self.home}"]


def find_grafana() -> GrafanaInstall | None:
    for name in BINARIES:
        binary = shutil.which(name)
        if binary is None:
            continue
        # A release tarball keeps bin/grafana under its home; packages keep the home in /usr/share.
        tarball_home = os.path.dirname(os.path.dirname(os.path.realpath(binary)))
        for home in (tarball_home, *HOMES):
            if os.path.exists(os.path.join(home, "conf", "defaults.ini")):
                return GrafanaInstall(binary, home)
        return GrafanaInstall(binary, None)
    return None


def find_dashboards(explicit: str | None = None) -> Path | None:
    """The shipped ``dashboards/`` (JSON + provisioning/): given, the package's checkout, or ./dashboards."""
    from fleetscope.dashboards import default_directory

    candidates = [Path(explicit)] if explicit else [default_directory(), Path.cwd() / "dashboards"]
    for directory in candidates:
        if any(directory.glob("*.json")) and (directory / "provisioning").is_dir():
            return directory
    return None


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    file: str


def provision(workdir: Path, dashboards: Path, prometheus_url: str, scrape_interval: float) -> list[Dashboard]:
    """Write the provisioning tree for Grafana under ``workdir``; returns the dashboards it loads."""
    shipped = dashboards / "provisioning"
    target = workdir / "provisioning"
    boards = workdir / "dashboards"
    for sub in ("datasources", "dashboards", "plugins", "alerting"):
        (target / sub).mkdir(parents=True, exist_ok=True)
    boards.mkdir(parents=True, exist_ok=True)

    datasources = _load(shipped / "datasources")
    for source in datasources.get("datasources", []):
        if source.get("type") == "prometheus":
            source["url"] = prometheus_url
            source.setdefault("jsonData", {})["timeInterval"] = f"{scrape_interval:g}s"
    _dump(target / "datasources" / "fleetscope.yaml", datasources)

    providers = _load(shipped / "dashboards")
    for provider in providers.get("providers", []):
        provider.setdefault("options", {})["path"] = str(boards)
    _dump(target / "dashboards" / "fleetscope.yaml", providers)

    loaded = []
    for path in sorted(dashboards.glob("*.json")):
        shutil.copyfile(path, boards / path.name)
        data = json.loads(path.read_text(encoding="utf-8"))
        loaded.append(Dashboard(str(data.get("uid", path.stem)), str(data.get("title", path.stem)), path.name))
    return loaded


def _load(directory: Path) -> dict[str, Any]:
    files = sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
    if not files:
        raise FileNotFoundError(f"no provisioning file in {directory}")
    data = yaml.safe_load(files[0].read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise TypeError(f"{files[0]}: not a provisioning file (a mapping at the top)")
    return data


def _dump(path: Path, data: dict[str, Any]) -> None:
    path.write_text("# Written by fleetscope demo from dashboards/provisioning/.\n"
                    + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


@dataclass
class Grafana:
    """One Grafana server on a fresh data directory, provisioned for the demo."""

    install: GrafanaInstall
    workdir: Path
    listen: str = "127.0.0.1:3000"
    process: subprocess.Popen[bytes] | None = None
    log_path: str = ""
    dashboards: list[Dashboard] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    def dashboard_url(self, board: Dashboard) -> str:
        return f"{self.url}/d/{board.uid}"

    def start(self, dashboards: Path, prometheus_url: str, scrape_interval: float, timeout: float = 90.0) -> None:
        if self.install.home is None:
            raise FileNotFoundError(f"{self.install.binary}: Grafana's home (conf/defaults.ini) not found")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.dashboards = provision(self.workdir, dashboards, prometheus_url, scrape_interval)
        host, _, port = self.listen.rpartition(":")
        home = [b for b in self.dashboards if b.uid == "fleetscope-fleet"] or self.dashboards[:1]
        env = {
            **os.environ,
            "GF_PATHS_DATA": str(self.workdir / "data"),
            "GF_PATHS_LOGS": str(self.workdir / "logs"),
            "GF_PATHS_PLUGINS": str(self.workdir / "plugins"),
            "GF_PATHS_PROVISIONING": str(self.workdir / "provisioning"),
            "GF_SERVER_HTTP_ADDR": host,
            "GF_SERVER_HTTP_PORT": port,
            # Loopback-only demo: look around without logging in (admin/admin to edit).
            "GF_AUTH_ANONYMOUS_ENABLED": "true",
            "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
            "GF_USERS_ALLOW_SIGN_UP": "false",
            # Offline and quiet: no update checks, usage reports, news or plugin downloads.
            "GF_ANALYTICS_REPORTING_ENABLED": "false",
            "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
            "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false",
            "GF_NEWS_NEWS_FEED_ENABLED": "false",
            "GF_PLUGINS_PREINSTALL_DISABLED": "true",
        }
        if home:
            env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] = str(self.workdir / "dashboards" / home[0].file)
        self.log_path = str(self.workdir / "grafana.log")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.install.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=self.install.home,
            )
        process = self.process

        def healthy() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"grafana exited with {process.returncode}; see {self.log_path}")
            return answers_ok(f"{self.url}/api/health")

        eventually(healthy, timeout, f"grafana to answer {self.url}/api/health", interval=0.3)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
