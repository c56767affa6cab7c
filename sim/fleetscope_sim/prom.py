"""A local Prometheus (and Alertmanager, when installed) watching a simulated cluster.

The binaries are the distribution's (Debian ``prometheus``,
``prometheus-alertmanager``); this module only writes their configuration,
starts and stops them, and reads the HTTP API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from fleetscope_sim.cluster import ClusterSpec
from fleetscope_sim.localhttp import answers_ok, get_json


def find_binary(name: str) -> str | None:
    return shutil.which(name)


def prometheus_config(
    cluster: ClusterSpec,
    rule_files: Sequence[str],
    scrape_interval: float = 5.0,
    alertmanager: str | None = None,
) -> dict[str, Any]:
    """Scrape every simulated node; ``instance`` is the node's name, as a real node's hostname would be."""
    interval = f"{scrape_interval:g}s"
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [os.path.abspath(p) for p in rule_files],
        "scrape_configs": [{
            "job_name": "fleetscope",
            "static_configs": [
                {"targets": [f"{cluster.host}:{node.port}"],
                 "labels": {"instance": node.name, "instance_type": node.profile.instance_type}}
                for node in cluster.nodes
            ],
        }],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config


@dataclass
class Prometheus:
    """One Prometheus server process on a fresh data directory."""

    workdir: str
    listen: str = "127.0.0.1:9090"
    process: subprocess.Popen[bytes] | None = None
    log_path: str = ""
    extra_args: Sequence[str] = field(default_factory=tuple)

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    def start(self, config: dict[str, Any], timeout: float = 60.0) -> None:
        binary = find_binary("prometheus")
        if binary is None:
            raise FileNotFoundError("prometheus is not installed (Debian: apt-get install prometheus)")
        os.makedirs(self.workdir, exist_ok=True)
        config_path = os.path.join(self.workdir, "prometheus.yml")
        with open(config_path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(config, handle, sort_keys=False)
        self.log_path = os.path.join(self.workdir, "prometheus.log")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={config_path}", f"--storage.tsdb.path={os.path.join(self.workdir, 'data')}",
                 f"--web.listen-address={self.listen}", "--storage.tsdb.retention.time=1d", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        wait_http(f"{self.url}/-/ready", self.process, self.log_path, timeout)

    def stop(self) -> None:
        stop_process(self.process)

    # -- API ----------------------------------------------------------------------------------

    def _get(self, path: str, **params: str) -> Any:
        body = get_json(f"{self.url}{path}", timeout=10.0, params=params)
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body}")
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing)."""
        return list(self._get("/api/v1/alerts")["alerts"])

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/query", query=expr)["result"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/rules")["groups"])

    def targets_up(self) -> dict[str, bool]:
        return {t["labels"]["instance"]: t["health"] == "up" for t in self._get("/api/v1/targets")["activeTargets"]}


@dataclass
class Alertmanager:
    workdir: str
    listen: str = "127.0.0.1:9093"
    process: subprocess.Popen[bytes] | None = None
    log_path: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    def start(self, timeout: float = 30.0) -> None:
        binary = find_binary("prometheus-alertmanager") or find_binary("alertmanager")
        if binary is None:
            raise FileNotFoundError("alertmanager is not installed (Debian: apt-get install prometheus-alertmanager)")
        os.makedirs(self.workdir, exist_ok=True)
        config_path = os.path.join(self.workdir, "alertmanager.yml")
        config = {
            "route": {"receiver": "log", "group_by": ["alertname", "training_job", "instance"],
                      "group_wait": "5s", "group_interval": "30s", "repeat_interval": "4h"},
            "receivers": [{"name": "log"}],
        }
        with open(config_path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(config, handle, sort_keys=False)
        self.log_path = os.path.join(self.workdir, "alertmanager.log")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={config_path}", f"--storage.path={os.path.join(self.workdir, 'data')}",
                 f"--web.listen-address={self.listen}", "--cluster.listen-address=",
                 ],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        wait_http(f"{self.url}/-/ready", self.process, self.log_path, timeout)

    def stop(self) -> None:
        stop_process(self.process)


def alertmanager_available() -> bool:
    return bool(find_binary("prometheus-alertmanager") or find_binary("alertmanager"))


def wait_http(url: str, process: subprocess.Popen[bytes], log_path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {process.returncode}; see {log_path}")
        if answers_ok(url):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {timeout}s; see {log_path}")
        time.sleep(0.3)


def stop_process(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
