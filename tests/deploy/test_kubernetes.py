"""The kustomize tree: every overlay renders, validates offline, and wires the daemon correctly."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate.utils
import pytest
import yaml

from fleetscope.cli import build_parser, config_from_args
from fleetscope.config import load
from tests.deploy.manifests import (
    KUSTOMIZE_DIR,
    OVERLAYS,
    REPO,
    by_kind,
    kustomize,
    load_generator,
    one,
    validate,
)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: kustomize(KUSTOMIZE_DIR / "overlays" / name) for name in OVERLAYS}


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    return pod["containers"][0]


def test_overlays_exist() -> None:
    assert {"kube-prometheus-stack", "plain", "kernel-log"} <= set(OVERLAYS)


def test_every_rendered_object_passes_schema_validation(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, objects in rendered.items():
        assert objects, f"overlay {name} rendered nothing"
        for obj in objects:
            try:
                validate(obj)
            except (jsonschema.ValidationError, kubernetes_validate.utils.SchemaNotFoundError) as exc:
                pytest.fail(f"{name}: {obj['kind']}/{obj['metadata']['name']}: {exc}")


def test_schema_validation_rejects_mistakes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["kube-prometheus-stack"]
    monitor = copy.deepcopy(one(objects, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["scrapeTimout"] = "10s"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)
    daemonset = copy.deepcopy(one(objects, "DaemonSet"))
    daemonset["spec"]["template"]["spec"]["hostNetwrk"] = True
    with pytest.raises(jsonschema.ValidationError):
        validate(daemonset)


def test_daemonset_runs_on_the_host_with_least_privilege(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name in ("kube-prometheus-stack", "plain"):
        objects = rendered[name]
        pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True and pod["hostPID"] is True
        assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert pod["priorityClassName"] == "system-node-critical"
        assert pod["automountServiceAccountToken"] is False
        assert pod["tolerations"], "GPU nodes are tainted; the daemon must tolerate it"
        main = container(objects)
        security = main["securityContext"]
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security["privileged"] is False
        env = {item["name"]: item.get("value") for item in main["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert "nvidia.com/gpu" not in json.dumps(main["resources"]), "the daemon must not take a GPU"
        host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        mounts = {m["name"]: m for m in main["volumeMounts"]}
        for volume, path in host_paths.items():
            assert mounts[volume].get("readOnly") is True, f"host path {path} must be mounted read-only"
        assert sorted(host_paths.values()) == ["/proc", "/sys", "/var/lib/fleetscope/nccl-inspector"]
        # The NCCL Inspector directory is read where the daemon looks by default, and made writable for
        # training pods by an init container, the only one with it mounted read-write.
        inspector = mounts["nccl-inspector"]["mountPath"]
        assert inspector == load(environ={}).nccl.dir
        (init,) = pod["initContainers"]
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert init["securityContext"]["allowPrivilegeEscalation"] is False
        assert [m["mountPath"] for m in init["volumeMounts"]] == [inspector]
        assert "0o1777" in init["command"][-1] and inspector in init["command"][-1]


def test_kernel_log_overlay_makes_dev_kmsg_readable(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["kernel-log"]
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    main = container(objects)
    kmsg = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/dev/kmsg"]
    assert kmsg and kmsg[0]["hostPath"]["type"] == "CharDevice"
    mount = next(m for m in main["volumeMounts"] if m["name"] == kmsg[0]["name"])
    assert mount["mountPath"] == "/dev/kmsg" and mount["readOnly"] is True
    assert main["securityContext"]["privileged"] is True
    assert "capabilities" not in main["securityContext"]
    env = {item["name"]: item["value"] for item in main["env"] if "value" in item}
    # The environment variable must be a real setting that turns the reader on.
    config = load(environ={"FLEETSCOPE_GPU_KMSG": env["FLEETSCOPE_GPU_KMSG"]})
    assert config.gpu.kmsg is True


def test_daemon_arguments_and_config_are_accepted_by_fleetscope(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    objects = rendered["kube-prometheus-stack"]
    main = container(objects)
    configmap = next(c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"].startswith("fleetscope-config"))
    config_path = tmp_path / "config.yaml"
    config_path.write_text(configmap["data"]["config.yaml"])
    mount = next(m for m in main["volumeMounts"] if m["name"] == "config")
    args = [a.replace(f"{mount['mountPath']}/config.yaml", str(config_path)) for a in main["args"]]
    assert args[0] == "serve"
    parsed = build_parser().parse_args(args)
    config = config_from_args(parsed)
    assert config.path.sysfs == "/host/sys" and config.path.procfs == "/host/proc"
    assert config.gpu.kmsg is False, "only the kernel-log overlay reads /dev/kmsg"
    port = int(config.web.listen_address.rpartition(":")[2])
    assert {p["containerPort"] for p in main["ports"]} == {port}
    token = next(item for item in main["env"] if item["name"] == "FLEETSCOPE_PUSH_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True
    assert load(environ={"FLEETSCOPE_PUSH_TOKEN": "s3cret"}).push.token == "s3cret"


def test_probes_hit_the_daemons_health_routes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    from fleetscope.serve.app import create_app
    from fleetscope.serve.engine import Engine

    routes = {getattr(route, "path", None) for route in create_app(Engine([])).routes}
    main = container(rendered["plain"])
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"/healthz", "/readyz"} <= routes
    ports = {p["name"] for p in main["ports"]}
    assert main["livenessProbe"]["httpGet"]["port"] in ports


def test_resources_are_the_benchmarks_recommendation(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The DaemonSet carries exactly what docs/benchmarks.md derived from its last full run."""
    import re

    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = text.split("## Kubernetes resources", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "docs/benchmarks.md has no recommended resources block"
    recommended = yaml.safe_load(block.group(1))["resources"]
    resources = container(rendered["plain"])["resources"]
    assert resources == recommended
    assert resources["requests"] == {"cpu": "25m", "memory": "96Mi"}


def test_service_and_monitor_select_the_daemon(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["kube-prometheus-stack"]
    daemonset = one(objects, "DaemonSet")
    service = one(objects, "Service")
    monitor = one(objects, "ServiceMonitor")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["publishNotReadyAddresses"] is True, "a stuck daemon must still be scraped"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    # kube-prometheus-stack only picks up monitors and rules carrying its release label.
    for obj in by_kind(objects, "ServiceMonitor") + by_kind(objects, "PrometheusRule"):
        assert obj["metadata"]["labels"].get("release") == "kube-prometheus-stack"


def test_plain_overlay_needs_no_operator_crds(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert not [o for o in rendered["plain"] if o["apiVersion"].startswith("monitoring.coreos.com/")]
    service = one(rendered["plain"], "Service")
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


# -- rules and dashboards carried by the manifests ----------------------------------------------


def rule_and_dashboard_expectations(repo: Path) -> tuple[dict[str, Any], dict[str, str]]:
    # Deployed: <name>.rules.yml; dotted variants (fleetscope.e2e.rules.yml) are test presets.
    plain = [p for p in sorted((repo / "alerts").glob("*.rules.y*ml")) if p.name.count(".") == 2]
    rules = {p.name: yaml.safe_load(p.read_text()) for p in plain}
    dashboards = {p.name: p.read_text() for p in sorted((repo / "dashboards").glob("*.json"))}
    return rules, dashboards


def assert_carries_exactly(objects: list[dict[str, Any]], rules: dict[str, Any], dashboards: dict[str, str]) -> None:
    rendered_rules = [r["spec"] for r in by_kind(objects, "PrometheusRule")]

    def canonical(value: Any) -> str:
        return json.dumps(value, sort_keys=True)

    assert sorted(map(canonical, rendered_rules)) == sorted(map(canonical, rules.values()))
    dashboard_maps = [
        c for c in by_kind(objects, "ConfigMap") if c["metadata"].get("labels", {}).get("grafana_dashboard")
    ]
    assert all(c["metadata"]["labels"]["grafana_dashboard"] == "1" for c in dashboard_maps)
    carried: dict[str, str] = {}
    for configmap in dashboard_maps:
        assert len(configmap["data"]) == 1, "one dashboard per ConfigMap"
        carried.update(configmap["data"])
    assert carried == dashboards


def test_committed_manifests_are_up_to_date() -> None:
    assert load_generator().main(["--check"]) == 0, "run python3 deploy/kubernetes/generate.py and commit"


def test_rendered_manifests_carry_exactly_the_repository_rules_and_dashboards(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    rules, dashboards = rule_and_dashboard_expectations(REPO)
    assert_carries_exactly(rendered["kube-prometheus-stack"], rules, dashboards)
    assert_carries_exactly(rendered["plain"], {}, dashboards)
    operator_flavour = REPO / "alerts" / "fleetscope.prometheusrule.yaml"
    if operator_flavour.exists() and (REPO / "alerts" / "fleetscope.rules.yml").exists():
        # The rules helper's own PrometheusRule must hold the same groups as the plain file.
        shipped = yaml.safe_load(operator_flavour.read_text())
        assert shipped["spec"] == rules["fleetscope.rules.yml"]


def test_dashboard_configmaps_match_the_dashboards_package(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Same names and data as fleetscope.dashboards.configmaps(), the other way the dashboards ship."""
    dashboards = pytest.importorskip("fleetscope.dashboards")
    expected = {c["metadata"]["name"]: c["data"] for c in dashboards.configmaps(REPO / "dashboards")}
    ours = {c["metadata"]["name"]: c["data"] for c in by_kind(rendered["plain"], "ConfigMap")
            if c["metadata"]["labels"].get("grafana_dashboard") == "1"}
    assert ours == expected


def write_sample_inputs(repo: Path) -> None:
    (repo / "alerts").mkdir(parents=True)
    (repo / "dashboards").mkdir()
    (repo / "alerts" / "fleetscope.rules.yml").write_text(
        "groups:\n"
        "  - name: fleetscope.rules\n"
        "    rules:\n"
        "      - record: instance:fleetscope_gpu_power_watts:sum\n"
        "        expr: sum without (gpu, uuid) (fleetscope_gpu_power_watts)\n"
        "  - name: fleetscope\n"
        "    rules:\n"
        "      - alert: FleetscopeGpuMissing\n"
        "        expr: |\n"
        "          fleetscope_gpu_nvml_devices\n"
        "            < fleetscope_gpu_expected_devices\n"
        "        for: 5m\n"
        "        labels: {severity: critical}\n"
        "        annotations: {summary: A GPU is missing., description: 'On {{ $labels.instance }}.'}\n"
    )
    (repo / "alerts" / "fleetscope.prometheusrule.yaml").write_text("kind: PrometheusRule\nspec: {groups: []}\n")
    (repo / "alerts" / "extra.rules.yaml").write_text("groups: []\n")
    (repo / "alerts" / "fleetscope.e2e.rules.yml").write_text("groups: [{name: e2e, rules: []}]\n")
    # Trailing spaces, tabs and unicode must survive the trip through YAML unchanged.
    (repo / "dashboards" / "GPU Health.json").write_text('{\n  "title": "GPU – health" ,  \n\t"panels": []\n}\n')
    (repo / "dashboards" / "training.json").write_text(json.dumps({"title": "Training", "panels": [{"id": 1}]}))
    (repo / "dashboards" / "notes.txt").write_text("not a dashboard")


def test_generator_wraps_rules_and_dashboards_exactly(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_sample_inputs(repo)
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUSTOMIZE_DIR, tree, ignore=shutil.ignore_patterns("__pycache__"))
    generator = load_generator()
    assert generator.main(["--repo", str(repo), "--out", str(tree)]) == 0
    assert generator.main(["--repo", str(repo), "--out", str(tree), "--check"]) == 0
    rules, dashboards = rule_and_dashboard_expectations(repo)
    assert len(rules) == 2 and len(dashboards) == 2
    for overlay in ("kube-prometheus-stack", "kernel-log"):
        objects = kustomize(tree / "overlays" / overlay)
        assert_carries_exactly(objects, rules, dashboards)
        for obj in objects:
            validate(obj)
    names = sorted(
        c["metadata"]["name"] for c in by_kind(objects, "ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]
    )
    assert names == ["fleetscope-gpu-health-dashboard", "fleetscope-training-dashboard"]
    rule_names = sorted(r["metadata"]["name"] for r in by_kind(objects, "PrometheusRule"))
    assert rule_names == ["fleetscope", "fleetscope-extra"]
    # A changed dashboard makes --check fail until the generator runs again.
    (repo / "dashboards" / "training.json").write_text('{"title": "Training v2"}')
    assert generator.main(["--repo", str(repo), "--out", str(tree), "--check"]) == 1


def test_generator_refuses_bad_inputs(tmp_path: Path) -> None:
    generator = load_generator()
    repo = tmp_path / "repo"
    (repo / "dashboards").mkdir(parents=True)
    (repo / "dashboards" / "broken.json").write_text("{not json")
    assert generator.main(["--repo", str(repo), "--out", str(tmp_path / "out")]) == 2
    (repo / "dashboards" / "broken.json").unlink()
    (repo / "alerts").mkdir()
    (repo / "alerts" / "x.rules.yml").write_text("- not a rule file\n")
    assert generator.main(["--repo", str(repo), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists(), "nothing is written when an input is bad"


@pytest.mark.e2e
def test_daemon_started_with_the_daemonset_arguments_passes_its_probes(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """On a node without GPUs or EFA (an empty host tree) the pod still goes live and ready."""
    import os
    import sys

    import httpx

    from fleetscope_sim.harness import Daemon

    objects = rendered["kube-prometheus-stack"]
    main = container(objects)
    configmap = next(c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"].startswith("fleetscope-config"))
    (tmp_path / "config.yaml").write_text(configmap["data"]["config.yaml"])
    for host_dir in ("sys", "proc"):
        (tmp_path / "host" / host_dir).mkdir(parents=True)
    args = [
        a.replace("/etc/fleetscope/config.yaml", str(tmp_path / "config.yaml"))
        .replace("=/host/", f"={tmp_path}/host/")
        .replace("=:9402", "=127.0.0.1:0")
        for a in main["args"]
    ]
    ready = tmp_path / "ready.json"
    daemon = Daemon([sys.executable, "-m", "fleetscope", *args, f"--web.ready-file={ready}"], tmp_path / "daemon.log",
                    env={k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}, ready_file=ready)
    try:
        daemon.start()
        probes = [probe["httpGet"]["path"] for probe in (main["livenessProbe"], main["readinessProbe"])]
        assert sorted(probes) == ["/healthz", "/readyz"]
        assert all(httpx.get(daemon.url + path, timeout=30).status_code == 200 for path in probes)
        metrics = httpx.get(daemon.url + "/metrics", timeout=30).text
        assert "fleetscope_build_info" in metrics
    finally:
        daemon.stop()
