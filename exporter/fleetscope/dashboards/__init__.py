"""Grafana dashboards as code.

The dashboards are built with grafana-foundation-sdk (pinned; an optional
dependency, imported only by :func:`build_all`) and committed as JSON under
``dashboards/`` at the repository root. The wheel ships that directory as
package data (``fleetscope/dashboards/json``, in the checkout a link to
``dashboards/``), so an installed fleetscope reads the same files. Everything
downstream reads that committed JSON, so it needs no SDK:

* :func:`queries` lists every panel query with its variables filled in, for
  running against a real Prometheus;
* :func:`configmaps` wraps each dashboard in a ConfigMap for the Grafana
  sidecar (label ``grafana_dashboard: "1"``);
* ``dashboards/provisioning/`` points docker-compose Grafana at the same files.

``fleetscope dashboards`` regenerates the JSON; ``--check`` fails when the
committed files are out of date.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# uid -> module with a ``build()`` returning the SDK dashboard model. The uid is also the file name.
DASHBOARD_MODULES: dict[str, str] = {
    "fleetscope-fleet": "fleetscope.dashboards.fleet",
    "fleetscope-node": "fleetscope.dashboards.node",
    "fleetscope-job": "fleetscope.dashboards.job",
    "fleetscope-gpu-health": "fleetscope.dashboards.gpu_health",
    "fleetscope-efa": "fleetscope.dashboards.efa",
}

# Values a query's variables take when it is run outside Grafana: regex variables match everything,
# interval variables get a window that holds several 15 s scrapes.
QUERY_DEFAULTS: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
    "__range_s": "3600",
    "cluster": ".*",
    "instance": ".*",
    "gpu": ".*",
    "training_job": ".*",
}

SIDECAR_LABEL = "grafana_dashboard"
SIDECAR_FOLDER_ANNOTATION = "grafana_folder"


def default_directory() -> Path:
    """The committed dashboards: ``dashboards/`` of the checkout, or the copy the installed wheel carries."""
    return Path(__file__).resolve().parent / "json"


def file_name(uid: str) -> str:
    return f"{uid}.json"


def build_all() -> dict[str, dict[str, Any]]:
    """Build every dashboard with the SDK; uid -> classic dashboard JSON (as plain data)."""
    from fleetscope.dashboards.kit import encode

    out: dict[str, dict[str, Any]] = {}
    for uid, module_name in DASHBOARD_MODULES.items():
        model = importlib.import_module(module_name).build()
        data = encode(model)
        if data.get("uid") != uid:
            raise ValueError(f"{module_name} builds uid {data.get('uid')!r}, registered as {uid!r}")
        out[uid] = data
    return out


def render(data: Mapping[str, Any]) -> str:
    """The committed text of one dashboard: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(directory: Path | None = None) -> list[Path]:
    directory = directory or default_directory()
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for uid, data in build_all().items():
        path = directory / file_name(uid)
        path.write_text(render(data), encoding="utf-8")
        written.append(path)
    return written


def stale(directory: Path | None = None) -> list[str]:
    """File names whose committed text differs from what the code generates (missing files included)."""
    directory = directory or default_directory()
    out = []
    for uid, data in build_all().items():
        path = directory / file_name(uid)
        if not path.is_file() or path.read_text(encoding="utf-8") != render(data):
            out.append(path.name)
    return out


def load(directory: Path | None = None) -> dict[str, dict[str, Any]]:
    """The committed dashboards, uid -> JSON data, in registration order."""
    directory = directory or default_directory()
    return {
        uid: json.loads((directory / file_name(uid)).read_text(encoding="utf-8")) for uid in DASHBOARD_MODULES
    }


# -- queries ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # uid
    panel: str  # panel title
    ref_id: str
    expr: str  # variables substituted
    template: str  # as in the dashboard
    instant: bool


_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)")


def substitute(expr: str, values: Mapping[str, str] = QUERY_DEFAULTS) -> str:
    """Replace ``$var`` / ``${var}`` / ``${var:fmt}`` with ``values``; unknown variables raise KeyError."""

    def replace(match: re.Match[str]) -> str:
        return values[match.group(1) or match.group(2)]

    return _VARIABLE.sub(replace, expr)


def iter_panels(data: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard, rows' nested panels included."""
    for panel in data.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(dashboards: Mapping[str, Mapping[str, Any]] | None = None,
            values: Mapping[str, str] = QUERY_DEFAULTS) -> list[PanelQuery]:
    """(dashboard, panel title, PromQL) for every target of every panel, variables filled with ``values``."""
    dashboards = dashboards if dashboards is not None else load()
    out = []
    for uid, data in dashboards.items():
        for panel in iter_panels(data):
            for target in panel.get("targets", []):
                template = target.get("expr", "")
                out.append(PanelQuery(
                    dashboard=uid, panel=panel.get("title", ""), ref_id=target.get("refId", ""),
                    expr=substitute(template, values), template=template,
                    instant=bool(target.get("instant")) and not target.get("range"),
                ))
    return out


# -- Kubernetes -------------------------------------------------------------------------------------


def configmaps(directory: Path | None = None, namespace: str = "monitoring",
               folder: str | None = "fleetscope") -> list[dict[str, Any]]:
    """One ConfigMap per committed dashboard, labelled for the Grafana dashboard sidecar.

    ``folder`` goes in the ``grafana_folder`` annotation; the Grafana chart's sidecar files the
    dashboards into that folder when ``sidecar.dashboards.folderAnnotation`` names it (with
    ``sidecar.dashboards.provider.foldersFromFilesStructure``). Pass None to leave it out.
    """
    directory = directory or default_directory()
    out = []
    for uid in DASHBOARD_MODULES:
        text = (directory / file_name(uid)).read_text(encoding="utf-8")
        metadata: dict[str, Any] = {"name": f"{uid}-dashboard", "namespace": namespace,
                                    "labels": {SIDECAR_LABEL: "1", "app.kubernetes.io/part-of": "fleetscope"}}
        if folder:
            metadata["annotations"] = {SIDECAR_FOLDER_ANNOTATION: folder}
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {file_name(uid): text}})
    return out
