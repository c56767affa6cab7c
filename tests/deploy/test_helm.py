"""The Helm chart (deploy/helm/fleetscope): linted and rendered offline by Helm v4 as a library.

helm-python-sdk binds Helm's Go SDK (libhelm_c) through ctypes: `Chart.load(...).render(...)` is the
template engine `helm template` runs, with the chart's values.schema.json enforced, and `lint` is
`helm lint`. No helm binary, no cluster. Every rendered object is validated the way the kustomize ones
are (tests/deploy/manifests.py), and the default render is compared object by object with the
kustomize overlays: one set of objects, two ways to install it.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

import fleetscope
from fleetscope.push.textformat import RESERVED_NAMES_REGEX
from fleetscope.rules.cli import main as rules_main
from tests.deploy.manifests import KUSTOMIZE_DIR, REPO, by_kind, kustomize, one, validate

CHART = REPO / "deploy" / "helm" / "fleetscope"
VERSION = fleetscope.__version__  # the one version (pyproject reads it, tests/test_release.py)
# The kustomize base's image (what scripts/image builds, tests/test_release.py): the chart runs the same.
IMAGE = "{newName}:{newTag}".format(
    **yaml.safe_load((KUSTOMIZE_DIR / "base" / "kustomization.yaml").read_text(encoding="utf-8"))["images"][0])
RELEASE = {"name": "fleetscope", "namespace": "fleetscope"}
# What Helm adds and kustomize does not: release bookkeeping labels and the config checksum that rolls the
# DaemonSet (kustomize rolls it by the ConfigMap's hash suffix instead).
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
                    "app.kubernetes.io/version")
HASHED_NAME = re.compile(r"^(fleetscope-(?:config|npd))-[a-z0-9]{10}$")
NPD_PROMETHEUS = "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
# Each kustomize overlay and the chart values that install the same objects.
OVERLAY_VALUES: dict[str, dict[str, Any]] = {
    "kube-prometheus-stack": {},
    "plain": {"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}},
    "kernel-log": {"kernelLog": {"enabled": True}},
    "node-problem-detector": {"nodeProblemDetector": {"enabled": True, "prometheusUrl": NPD_PROMETHEUS}},
    "dcgm-compat": {"dcgmCompat": {"enabled": True}},
}
# Everything optional turned on at once, for schema validation of every template's output.
EVERYTHING: dict[str, Any] = {
    "kernelLog": {"enabled": True},
    "podResources": {"enabled": True},
    "nodeProblemDetector": {"enabled": True, "prometheusUrl": NPD_PROMETHEUS},
    "dcgmCompat": {"enabled": True},
    "podMonitor": {"enabled": True, "relabelings": [{"targetLabel": "cluster", "replacement": "east"}]},
    "serviceMonitor": {"metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}],
                       "tlsConfig": {"insecureSkipVerify": True},
                       "basicAuth": {"username": {"name": "scrape", "key": "user"},
                                     "password": {"name": "scrape", "key": "password"}}},
    "web": {"configSecret": "fleetscope-web", "tls": True},
    "push": {"tokenSecret": {"create": True, "token": "s3cret"}},
    "tolerateNoExecute": True,
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "extraArgs": ["--log.format=json"],
    "extraEnv": [{"name": "FLEETSCOPE_LOG_LEVEL", "value": "debug"}],
    "image": {"digest": "sha256:" + "a" * 64},
    "dashboards": {"namespace": "monitoring"},
}


def render(values: dict[str, Any] | None = None, **release: str) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values, **{**RELEASE, **release})
    return [doc for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def daemon_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    return pod


def containers(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in daemon_pod(objects)["containers"]}


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def overlays() -> dict[str, list[dict[str, Any]]]:
    return {name: kustomize(KUSTOMIZE_DIR / "overlays" / name) for name in OVERLAY_VALUES}


def test_chart_version_is_the_package_version() -> None:
    with helm.Chart.load(CHART) as chart:
        assert chart.metadata["version"] == chart.metadata["appVersion"] == VERSION


def test_notes_say_how_to_check_the_install() -> None:
    with helm.Chart.load(CHART) as chart:
        notes = chart.render({"podMonitor": {"enabled": True}}, **RELEASE)["fleetscope/templates/NOTES.txt"]
    assert f"fleetscope {VERSION} is installed" in notes and "rollout status daemonset/fleetscope" in notes
    assert "scraped twice" in notes


def test_chart_lints_clean() -> None:
    report = helm.lint(CHART, strict=True, kube_version="v1.32.0")
    assert report["errors"] == []
    assert report["messages"] == []  # not even helm's "icon is recommended"
    assert report["total_charts_linted"] == 1


def test_default_render_is_a_daemonset_on_this_versions_image(default: list[dict[str, Any]]) -> None:
    assert IMAGE.endswith(f":{VERSION}")
    pod = daemon_pod(default)
    assert [c["image"] for c in pod["containers"]] == [IMAGE]
    assert [c["image"] for c in pod["initContainers"]] == [IMAGE]
    assert pod["hostNetwork"] is True and pod["automountServiceAccountToken"] is False
    assert sorted(obj["kind"] for obj in default) == sorted(
        ["ConfigMap"] * 6 + ["DaemonSet", "PrometheusRule", "Service", "ServiceAccount", "ServiceMonitor"])


def test_prometheusrule_carries_every_shipped_alert_and_record(default: list[dict[str, Any]]) -> None:
    shipped = yaml.safe_load((REPO / "alerts" / "fleetscope.rules.yml").read_text(encoding="utf-8"))["groups"]
    rule = one(default, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"] == shipped
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert len(alerts) >= 48
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            if "alert" in r:
                assert r["annotations"]["runbook_url"].startswith("https://"), r["alert"]


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["default", "everything"])
def test_every_rendered_object_passes_schema_validation(values: dict[str, Any]) -> None:
    objects = render(values)
    kinds = {obj["kind"] for obj in objects}
    if values:
        assert {"PodMonitor", "Secret", "ClusterRoleBinding"} <= kinds
    for obj in objects:
        validate(obj)


def normalised(objects: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    """Objects keyed by kind and name, with what legitimately differs between Helm and kustomize taken out."""
    hashed = {m.group(0): m.group(1) for obj in objects if (m := HASHED_NAME.match(obj["metadata"]["name"]))}

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in HELM_ONLY_LABELS and k != "checksum/config"}
        if isinstance(value, list):
            items = [clean(v) for v in value]
            # Containers, env, volumes and mounts: order carries no meaning, and kustomize's patches reorder them.
            if items and all(isinstance(v, dict) and "name" in v for v in items):
                items.sort(key=lambda v: (v["name"], json.dumps(v, sort_keys=True)))
            return items
        if isinstance(value, str):
            return hashed.get(value, value)
        return value

    out = {}
    for original in objects:
        if original["kind"] == "Namespace":  # charts leave namespaces to `helm install --create-namespace`
            continue
        obj = clean(copy.deepcopy(original))
        if obj["kind"] == "ConfigMap" and "config.yaml" in obj.get("data", {}):
            obj["data"]["config.yaml"] = yaml.safe_load(obj["data"]["config.yaml"])
        for key in ("annotations", "labels"):
            template = obj.get("spec", {}).get("template", {}).get("metadata", {})
            if key in template and not template[key]:
                del template[key]
        out[(obj["kind"], obj["metadata"]["name"])] = obj
    return out


@pytest.mark.parametrize("overlay", sorted(OVERLAY_VALUES))
def test_chart_renders_the_same_objects_as_the_kustomize_overlay(
    overlay: str, overlays: dict[str, list[dict[str, Any]]]
) -> None:
    ours = normalised(render(OVERLAY_VALUES[overlay]))
    theirs = normalised(overlays[overlay])
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        if ours[key] != theirs[key]:
            diff = difflib.unified_diff(
                yaml.safe_dump(theirs[key], width=200).splitlines(), yaml.safe_dump(ours[key], width=200).splitlines(),
                f"kustomize overlays/{overlay}", "helm chart", lineterm="", n=2)
            pytest.fail(f"{key} differs between the overlay and the chart:\n" + "\n".join(diff))


@pytest.mark.parametrize("values, message", [
    ({"imageTag": "1.0"}, "additional properties 'imageTag' not allowed"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"tolerateNoExecute": "yes"}, "/tolerateNoExecute"),
    ({"tolerations": [{"operator": "Exists", "effect": "NoExecut"}]}, "/tolerations/0/effect"),
    ({"nodeAffinity": {"instanceTypes": []}}, "/nodeAffinity/instanceTypes"),
    ({"serviceMonitor": {"interval": "15 seconds"}}, "/serviceMonitor/interval"),
    ({"serviceMonitor": {"lables": {"release": "x"}}}, "additional properties 'lables' not allowed"),
    ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"port": 70000}, "/port"),
    ({"nodeProblemDetector": {"prometheusUrl": "prometheus:9090"}}, "/nodeProblemDetector/prometheusUrl"),
    ({"extraArgs": ["log.level=debug"]}, "/extraArgs/0"),
])
def test_schema_rejects_bad_values(values: dict[str, Any], message: str) -> None:
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
            chart.validate_schema(values)
        with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
            chart.render(values, **RELEASE)
    assert helm.lint(CHART, values)["errors"], "helm lint with these values must fail too"


def test_no_execute_is_tolerated_only_when_opted_in(default: list[dict[str, Any]]) -> None:
    assert daemon_pod(default)["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]
    tolerations = daemon_pod(render({"tolerateNoExecute": True}))["tolerations"]
    assert {"operator": "Exists", "effect": "NoExecute"} in tolerations
    assert {"operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert not any(t.get("effect") == "NoExecute" for t in daemon_pod(render({"tolerateNoExecute": False}))
                   ["tolerations"])
    assert "tolerations" not in daemon_pod(render({"tolerations": []}))
    assert daemon_pod(render({"tolerations": [], "tolerateNoExecute": True}))["tolerations"] == [
        {"operator": "Exists", "effect": "NoExecute"}]


def test_affinity_covers_the_gpu_instance_types_and_can_be_replaced(default: list[dict[str, Any]]) -> None:
    terms = daemon_pod(default)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (expression,) = terms["nodeSelectorTerms"][0]["matchExpressions"]
    assert expression["key"] == "node.kubernetes.io/instance-type"
    assert set(expression["values"]) == {"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5.4xlarge", "p5e.48xlarge",
                                         "p5en.48xlarge", "p6-b200.48xlarge", "p6e-gb200.36xlarge"}
    gfd = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}}
    assert daemon_pod(render({"affinity": gfd}))["affinity"] == gfd


def test_monitors_drop_reserved_names_and_keep_the_job_the_rules_select() -> None:
    objects = render({"podMonitor": {"enabled": True}}, name="gpu-agents")
    monitors = by_kind(objects, "ServiceMonitor") + by_kind(objects, "PodMonitor")
    assert len(monitors) == 2
    for monitor in monitors:
        (endpoint,) = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        assert {"targetLabel": "job", "replacement": "fleetscope", "action": "replace"} in endpoint["relabelings"]
        (drop,) = endpoint["metricRelabelings"]
        assert drop == {"sourceLabels": ["__name__"], "regex": RESERVED_NAMES_REGEX, "action": "drop"}
        pattern = re.compile(f"^(?:{drop['regex']})$")  # Prometheus anchors relabel regexes
        for forged in ("ALERTS", "ALERTS_FOR_STATE", "up", "scrape_samples_scraped",
                       "training_job:fleetscope_training_progress:hung"):
            assert pattern.match(forged), forged
        for kept in ("fleetscope_gpu_power_watts", "fleetscope_up", "uptime_seconds", "process_cpu_seconds_total"):
            assert not pattern.match(kept), kept
    assert one(objects, "DaemonSet")["metadata"]["name"] == "gpu-agents-fleetscope"


def test_web_config_secret_is_mounted_and_passed_to_the_daemon() -> None:
    objects = render({"web": {"configSecret": "fleetscope-web", "tls": True},
                      "serviceMonitor": {"tlsConfig": {"ca": {"secret": {"name": "fleetscope-web", "key": "ca.crt"}}}}})
    daemon = containers(objects)["fleetscope"]
    assert "--web.config.file=/etc/fleetscope-web/web-config.yml" in daemon["args"]
    mount = next(m for m in daemon["volumeMounts"] if m["name"] == "web-config")
    assert mount == {"name": "web-config", "mountPath": "/etc/fleetscope-web", "readOnly": True}
    volume = next(v for v in daemon_pod(objects)["volumes"] if v["name"] == "web-config")
    assert volume["secret"]["secretName"] == "fleetscope-web"
    assert daemon["livenessProbe"]["httpGet"]["scheme"] == daemon["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["ca"]["secret"]["name"] == "fleetscope-web"
    plain = containers(render())["fleetscope"]
    assert not any(a.startswith("--web.config.file") for a in plain["args"])


def test_push_token_secret_is_optional_or_created() -> None:
    def token_ref(objects: list[dict[str, Any]]) -> dict[str, Any]:
        env = containers(objects)["fleetscope"]["env"]
        ref: dict[str, Any] = next(e for e in env if e["name"] == "FLEETSCOPE_PUSH_TOKEN")["valueFrom"]["secretKeyRef"]
        return ref

    assert token_ref(render()) == {"name": "fleetscope-push", "key": "token", "optional": True}
    objects = render({"push": {"tokenSecret": {"create": True, "token": "s3cret"}}})
    assert token_ref(objects) == {"name": "fleetscope-push", "key": "token", "optional": False}
    assert one(objects, "Secret")["data"] == {"token": "czNjcmV0"}
    with pytest.raises(helm.HelmRenderError, match=re.escape("push.tokenSecret.token")):
        render({"push": {"tokenSecret": {"create": True}}})


def test_node_problem_detector_containers_have_probes() -> None:
    objects = render({"nodeProblemDetector": {"enabled": True}})
    by_name = containers(objects)
    assert list(by_name) == ["verdicts", "npd", "fleetscope"]
    for name in ("verdicts", "npd"):
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in by_name[name], f"{name} has no {probe}"
    npd = by_name["npd"]
    port = npd["livenessProbe"]["httpGet"]["port"]
    assert f"--port={port}" in npd["command"] and "--address=127.0.0.1" in npd["command"]
    assert port not in (20256, 20257), "NPD's default ports belong to a cluster's own NPD"
    liveness = by_name["verdicts"]["livenessProbe"]["exec"]["command"][-1]
    assert "/run/fleetscope/verdicts/gpu" in liveness and "-lt 120" in liveness


def test_tuned_rules_reach_the_prometheusrule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The operator's flow: a settings file, `fleetscope rules --format helm-values`, `helm install -f`."""
    settings = tmp_path / "tuning.yaml"
    settings.write_text("throttle_share: 0.4\nthrottle_for: 20m\nrunbook_base_url: https://wiki.example.com/rb\n",
                        encoding="utf-8")
    assert rules_main(["--values", str(settings), "--format", "helm-values"]) == 0
    values = yaml.safe_load(capsys.readouterr().out)
    rule = one(render(values), "PrometheusRule")
    (throttled,) = (r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "GpuThrottled")
    assert throttled["for"] == "20m" and throttled["expr"].endswith("> 0.4")
    assert throttled["annotations"]["runbook_url"] == "https://wiki.example.com/rb#gputhrottled"
    validate(rule)
    # Settings written into the values by hand, without the groups they need, fail the render rather than
    # being silently ignored.
    with pytest.raises(helm.HelmRenderError, match="fleetscope rules --values"):
        render({"prometheusRule": {"settings": {"throttle_for": "20m"}}})


def test_kustomize_takes_the_same_tuning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/deploy.md's overlay patch with `--format prometheusrule` gives the chart's tuned groups."""
    settings = tmp_path / "tuning.yaml"
    settings.write_text("throttle_for: 20m\nstraggler_for: 2m\n", encoding="utf-8")
    assert rules_main(["--values", str(settings), "--format", "helm-values"]) == 0
    chart_rule = one(render(yaml.safe_load(capsys.readouterr().out)), "PrometheusRule")
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUSTOMIZE_DIR, tree, ignore=shutil.ignore_patterns("__pycache__"))
    overlay = tree / "overlays" / "tuned"
    overlay.mkdir()
    assert rules_main(["--values", str(settings), "--format", "prometheusrule"]) == 0
    (overlay / "fleetscope-rules.yaml").write_text(capsys.readouterr().out, encoding="utf-8")
    (overlay / "kustomization.yaml").write_text(
        "resources: [../kube-prometheus-stack]\n"
        "patches:\n  - path: fleetscope-rules.yaml\n    target: {kind: PrometheusRule, name: fleetscope}\n")
    kustomize_rule = one(kustomize(overlay), "PrometheusRule")
    assert kustomize_rule["spec"] == chart_rule["spec"]
    (throttled,) = (r for g in chart_rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "GpuThrottled")
    assert throttled["for"] == "20m"


def test_readme_documents_every_value() -> None:
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    undocumented = [key for key in values if f"`{key}`" not in readme and f"`{key}." not in readme]
    assert undocumented == []


def test_chart_files_are_the_repositorys(default: list[dict[str, Any]]) -> None:
    """files/ is copied by deploy/kubernetes/generate.py; stale copies fail test_kubernetes' --check too."""
    dashboards = {name: text for obj in by_kind(default, "ConfigMap") for name, text in obj["data"].items()
                  if obj["metadata"]["labels"].get("grafana_dashboard") == "1"}
    assert dashboards == {p.name: p.read_text(encoding="utf-8") for p in sorted((REPO / "dashboards").glob("*.json"))}


def test_dcgm_compat_rules_are_opt_in() -> None:
    """Off by default; on, a second PrometheusRule carrying alerts/fleetscope.dcgm.rules.yml as is."""
    assert "fleetscope-dcgm" not in {obj["metadata"]["name"] for obj in by_kind(render(), "PrometheusRule")}
    rules = {obj["metadata"]["name"]: obj for obj in by_kind(render({"dcgmCompat": {"enabled": True}}),
                                                             "PrometheusRule")}
    assert set(rules) == {"fleetscope", "fleetscope-dcgm"}
    shipped = yaml.safe_load((REPO / "alerts" / "fleetscope.dcgm.rules.yml").read_text(encoding="utf-8"))
    assert rules["fleetscope-dcgm"]["spec"] == shipped
    assert rules["fleetscope-dcgm"]["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_pod_resources_mounts_the_kubelet_socket_read_only_and_sets_the_flag(default) -> None:
    flag = "--gpu.pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock"
    assert flag not in containers(default)["fleetscope"]["args"]  # off by default
    objects = render({"podResources": {"enabled": True}})
    daemon = containers(objects)["fleetscope"]
    assert flag in daemon["args"]
    mount = next(m for m in daemon["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    volume = next(v for v in daemon_pod(objects)["volumes"] if v["name"] == "pod-resources")
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
