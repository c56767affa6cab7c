"""Grafana for the demo: found on PATH, provisioned from the shipped files, waited for, stopped.

No Grafana server can be installed on the CI machine (Debian does not package it), so a stand-in
``grafana`` binary plays its part: it reads the provisioning tree the way Grafana does (datasource
and dashboard-provider YAML, then every JSON in the provider's path), records what it found, and
answers ``/api/health``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from fleetscope.dashboards import DASHBOARD_MODULES
from fleetscope_sim.grafana import COMPOSE_HINT, Grafana, find_dashboards, find_grafana
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]

STAND_IN = """#!{python}
import http.server, json, os, pathlib, sys
import yaml

prov = pathlib.Path(os.environ["GF_PATHS_PROVISIONING"])
sources = yaml.safe_load((prov / "datasources" / "fleetscope.yaml").read_text())["datasources"]
providers = yaml.safe_load((prov / "dashboards" / "fleetscope.yaml").read_text())["providers"]
boards = [json.loads(p.read_text()) for p in sorted(pathlib.Path(providers[0]["options"]["path"]).glob("*.json"))]
record = {{
    "argv": sys.argv, "cwd": os.getcwd(), "sources": sources, "providers": providers,
    "uids": [b["uid"] for b in boards],
    "env": {{k: v for k, v in os.environ.items() if k.startswith("GF_")}},
}}
pathlib.Path(os.environ["STAND_IN_RECORD"]).write_text(json.dumps(record))


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(b'{{"database": "ok"}}')

    def log_message(self, *args):
        pass


address = (os.environ["GF_SERVER_HTTP_ADDR"], int(os.environ["GF_SERVER_HTTP_PORT"]))
http.server.HTTPServer(address, Health).serve_forever()
"""


@pytest.fixture
def grafana_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A release-tarball layout: <home>/bin/grafana and <home>/conf/defaults.ini."""
    home = tmp_path / "grafana-v13"
    (home / "bin").mkdir(parents=True)
    (home / "conf").mkdir()
    (home / "conf" / "defaults.ini").write_text("[paths]\n")
    binary = home / "bin" / "grafana"
    binary.write_text(STAND_IN.format(python=sys.executable))
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STAND_IN_RECORD", str(tmp_path / "record.json"))
    return home


def test_grafana_starts_provisioned_with_the_shipped_dashboards(grafana_on_path: Path, tmp_path: Path) -> None:
    install = find_grafana()
    assert install is not None and install.home == str(grafana_on_path)
    dashboards = find_dashboards(str(ROOT / "dashboards"))
    assert dashboards == ROOT / "dashboards"
    grafana = Grafana(install, tmp_path / "run", listen=f"127.0.0.1:{free_port()}")
    try:
        grafana.start(dashboards, "http://127.0.0.1:19090", scrape_interval=5.0, timeout=30)
        record = json.loads((tmp_path / "record.json").read_text())
    finally:
        grafana.stop()
    assert grafana.process is not None and grafana.process.poll() is not None  # stopped
    assert record["argv"][1:] == ["server", f"--homepath={grafana_on_path}"]
    assert record["cwd"] == str(grafana_on_path)
    shipped = yaml.safe_load((ROOT / "dashboards/provisioning/datasources/fleetscope.yaml").read_text())
    [source] = record["sources"]
    assert source["url"] == "http://127.0.0.1:19090" and source["jsonData"]["timeInterval"] == "5s"
    assert {k: v for k, v in source.items() if k not in ("url", "jsonData")} == \
        {k: v for k, v in shipped["datasources"][0].items() if k not in ("url", "jsonData")}
    assert sorted(record["uids"]) == sorted(DASHBOARD_MODULES)
    assert record["providers"][0]["folder"] == "fleetscope"
    env = record["env"]
    assert env["GF_SERVER_HTTP_ADDR"] == "127.0.0.1" and env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"].endswith("fleetscope-fleet.json")
    assert all(env[k] == "false" for k in ("GF_ANALYTICS_REPORTING_ENABLED", "GF_ANALYTICS_CHECK_FOR_UPDATES"))
    urls = {b.uid: grafana.dashboard_url(b) for b in grafana.dashboards}
    assert urls["fleetscope-job"] == f"{grafana.url}/d/fleetscope-job"


def test_no_grafana_on_path_is_no_grafana(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_grafana() is None
    # A binary without its home next to it (nor in a package's place) is found but cannot start.
    (tmp_path / "grafana-server").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "grafana-server").chmod(0o755)
    install = find_grafana()
    assert install is not None and install.binary.endswith("grafana-server")
    if install.home is None:
        with pytest.raises(FileNotFoundError, match=r"conf/defaults\.ini"):
            Grafana(install, tmp_path / "run").start(ROOT / "dashboards", "http://127.0.0.1:9", 5.0)


def test_the_compose_command_the_demo_names_is_the_one_the_compose_file_documents() -> None:
    assert f"#   {COMPOSE_HINT}\n" in (ROOT / "docker-compose.yml").read_text()
