"""Sidecar ConfigMaps and docker-compose provisioning come from the committed JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from fleetscope import dashboards

PROVISIONING = dashboards.default_directory() / "provisioning"
DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def test_one_configmap_per_dashboard_with_the_sidecar_label() -> None:
    maps = dashboards.configmaps()
    assert len(maps) == len(dashboards.DASHBOARD_MODULES)
    names = [m["metadata"]["name"] for m in maps]
    assert len(set(names)) == len(names)
    for cm, uid in zip(maps, dashboards.DASHBOARD_MODULES, strict=True):
        assert cm["apiVersion"] == "v1" and cm["kind"] == "ConfigMap"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert DNS_1123.fullmatch(cm["metadata"]["name"]) and len(cm["metadata"]["name"]) <= 253
        (key, text), = cm["data"].items()
        assert key == f"{uid}.json"
        # The same bytes as the committed file, so Grafana loads exactly what the tests checked.
        assert text == (dashboards.default_directory() / key).read_text(encoding="utf-8")
        assert json.loads(text)["uid"] == uid
        assert len(text.encode()) < 1024 * 1024  # the API server's ConfigMap limit


def test_configmap_options(tmp_path: Path) -> None:
    (tmp_path / "fleetscope-fleet.json").write_text('{"uid": "fleetscope-fleet"}\n')
    for uid in list(dashboards.DASHBOARD_MODULES)[1:]:
        (tmp_path / f"{uid}.json").write_text(json.dumps({"uid": uid}))
    maps = dashboards.configmaps(tmp_path, namespace="observability", folder=None)
    assert maps[0]["data"] == {"fleetscope-fleet.json": '{"uid": "fleetscope-fleet"}\n'}
    assert all(m["metadata"]["namespace"] == "observability" for m in maps)
    assert all("annotations" not in m["metadata"] for m in maps)
    assert dashboards.configmaps(tmp_path)[0]["metadata"]["annotations"] == {"grafana_folder": "fleetscope"}


def test_configmaps_serialise_as_kubernetes_yaml() -> None:
    text = yaml.safe_dump_all(dashboards.configmaps(), sort_keys=False)
    documents = list(yaml.safe_load_all(text))
    assert [d["metadata"]["name"] for d in documents] == [m["metadata"]["name"] for m in dashboards.configmaps()]


def test_datasource_provisioning() -> None:
    data = yaml.safe_load((PROVISIONING / "datasources" / "fleetscope.yaml").read_text())
    assert data["apiVersion"] == 1
    (source,) = data["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy" and source["isDefault"] is True
    assert source["url"].startswith("http://") and source["uid"]


def test_dashboard_provider_loads_the_committed_directory() -> None:
    data = yaml.safe_load((PROVISIONING / "dashboards" / "fleetscope.yaml").read_text())
    assert data["apiVersion"] == 1
    (provider,) = data["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/var/lib/grafana/dashboards")
    # A folder name and folders-from-files are mutually exclusive in Grafana.
    assert not (provider.get("folder") and provider["options"].get("foldersFromFilesStructure"))
    assert provider["allowUiUpdates"] is False  # the JSON in git is the source of truth
