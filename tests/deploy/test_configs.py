"""docker-compose.yml and every Prometheus/Alertmanager configuration shipped under deploy/."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetscope.cli import build_parser
from tests.conftest import require_binary
from tests.deploy.manifests import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
PROMETHEUS_EXAMPLES = sorted((REPO / "deploy" / "prometheus").glob("*.yml"))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The compose file as a compose implementation resolves it (`docker-compose config`)."""
    binary = require_binary("docker-compose")
    result = subprocess.run([binary, "--project-directory", str(REPO), "-f", str(COMPOSE_FILE), "config"],
                            capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path, container path) of every bind mount; named volumes are left out."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                mounts.append((Path(volume["source"]), volume["target"]))
            continue
        source, target = volume.split(":")[:2]
        if source.startswith(("/", ".")):
            mounts.append((Path(source), target))
    return mounts


def materialise(service: dict[str, Any], into: Path) -> Path:
    """Lay the service's bind mounts out under ``into`` as the container would see them."""
    for source, target in bind_mounts(service):
        destination = into / target.lstrip("/")
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, destination)
        else:
            shutil.copy(source, destination)
    return into


def test_compose_file_has_no_version_key() -> None:
    assert "version" not in yaml.safe_load(COMPOSE_FILE.read_text())


def test_compose_stack_has_the_four_parts(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"simulator", "prometheus", "alertmanager", "grafana"}


def test_every_mounted_file_exists(compose: dict[str, Any]) -> None:
    checked = 0
    for name, service in compose["services"].items():
        for source, target in bind_mounts(service):
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
            checked += 1
        build = service.get("build")
        if build:
            context = Path(build["context"])
            assert (context / build.get("dockerfile", "Dockerfile")).is_file()
    assert checked >= 5


def test_dockerfile_copies_only_existing_paths(compose: dict[str, Any]) -> None:
    build = compose["services"]["simulator"]["build"]
    dockerfile = Path(build["context"]) / build["dockerfile"]
    stages: set[str | None] = set()
    args: dict[str, str] = {}  # ARG defaults before the first FROM: the base image is a build argument
    for line in dockerfile.read_text().splitlines():
        if line.startswith("ARG ") and "=" in line and not stages:
            name, _, default = line[4:].partition("=")
            args[name.strip()] = default.strip()
        if line.startswith("COPY ") and "--from=" not in line:
            for source in [word for word in line.split()[1:-1] if not word.startswith("--")]:
                assert (Path(build["context"]) / source).exists(), f"{dockerfile}: COPY {source}: no such path"
        if line.startswith("FROM "):
            resolved = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m[1], m[0]), line)
            base = re.fullmatch(r"FROM ([\w./:-]+)(?: AS ([\w-]+))?", resolved)
            assert base, f"unreadable FROM line: {line}"
            # a base image pinned to a version, or a stage built above
            assert base[1] in stages or re.fullmatch(r"[\w./-]+:\d[\w.-]*", base[1]), f"unpinned base image: {line}"
            stages.add(base[2])
    assert build.get("target") in stages, build  # the simulator's stage, which installs sim/
    assert "COPY sim ./sim" in dockerfile.read_text()


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        image = service["image"]
        tag = image.rpartition(":")[2]
        assert ":" in image and tag != "latest" and re.match(r"v?\d+\.\d+", tag), f"{name}: unpinned image {image}"


def test_ports_are_bound_to_loopback(compose: dict[str, Any]) -> None:
    published = 0
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name}: port {port} is reachable from other machines"
            published += 1
    assert published == 3  # Prometheus (via the simulator), Alertmanager, Grafana


def test_prometheus_reaches_the_simulated_nodes(compose: dict[str, Any]) -> None:
    """The compose scrape targets are exactly where `fleetscope simulate` puts its nodes."""
    from fleetscope_sim.cluster import make_cluster
    from fleetscope_sim.faults import load_schedule
    from fleetscope_sim.prom import prometheus_config

    services = compose["services"]
    assert services["prometheus"]["network_mode"] == "service:simulator"
    assert "prometheus" in services["simulator"]["networks"]["default"]["aliases"]
    command = services["simulator"]["command"]
    args = build_parser().parse_args(command)
    assert args.command == "simulate"
    # The fault schedule must name nodes, GPUs, devices and ranks that exist (make_cluster checks).
    faults_path = next(source for source, target in bind_mounts(services["simulator"]) if target == args.faults)
    faults = load_schedule(str(faults_path))
    assert faults
    spec = make_cluster(nodes=args.nodes, jobs=args.jobs, base_port=args.base_port, profiles=args.profiles.split(","),
                        faults=faults)
    expected = prometheus_config(spec, [])["scrape_configs"][0]
    config = yaml.safe_load((REPO / "deploy" / "compose" / "prometheus.yml").read_text())
    ours = next(job for job in config["scrape_configs"] if job["job_name"] == "fleetscope")
    assert ours["static_configs"] == expected["static_configs"]


def test_grafana_gets_datasource_and_dashboards(compose: dict[str, Any], tmp_path: Path) -> None:
    grafana = materialise(compose["services"]["grafana"], tmp_path)
    provisioning = grafana / "etc" / "grafana" / "provisioning"
    datasources = [yaml.safe_load(p.read_text()) for p in (provisioning / "datasources").glob("*.y*ml")]
    urls = {ds["url"] for doc in datasources for ds in doc["datasources"]}
    assert "http://prometheus:9090" in urls
    providers = [yaml.safe_load(p.read_text()) for p in (provisioning / "dashboards").glob("*.y*ml")]
    paths = [provider["options"]["path"] for doc in providers for provider in doc["providers"]]
    dashboards = [p for path in paths for p in (grafana / path.lstrip("/")).glob("*.json")]
    assert sorted(p.name for p in dashboards) == sorted(p.name for p in (REPO / "dashboards").glob("*.json"))
    home = compose["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (grafana / home.lstrip("/")).is_file()


def test_compose_prometheus_config_and_rules_pass_promtool(compose: dict[str, Any], tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    prometheus = compose["services"]["prometheus"]
    root = materialise(prometheus, tmp_path)
    config_arg = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config = root / config_arg.partition("=")[2].lstrip("/")
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The glob in rule_files matched the mounted rules (promtool names each rule file it checks).
    assert "fleetscope.rules.yml" in result.stdout + result.stderr


def test_compose_alertmanager_config_passes_amtool(compose: dict[str, Any], tmp_path: Path) -> None:
    amtool = require_binary("amtool")
    service = compose["services"]["alertmanager"]
    root = materialise(service, tmp_path)
    config_arg = next(a for a in service["command"] if a.startswith("--config.file="))
    result = subprocess.run([amtool, "check-config", str(root / config_arg.partition("=")[2].lstrip("/"))],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_inhibits_with_alerts_that_exist() -> None:
    config = yaml.safe_load((REPO / "deploy" / "compose" / "alertmanager.yml").read_text())
    rules = yaml.safe_load((REPO / "alerts" / "fleetscope.rules.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule}
    for inhibit in config["inhibit_rules"]:
        for matcher in inhibit["source_matchers"]:
            name = re.fullmatch(r'alertname="(\w+)"', matcher)
            assert name is None or name.group(1) in alerts, f"inhibit source {matcher} matches no shipped alert"


def kubernetes_sd_as_static(config: dict[str, Any]) -> dict[str, Any]:
    """Debian's promtool is built without Kubernetes discovery: swap it for a static target, check the rest."""
    allowed_roles = {"node", "service", "pod", "endpoints", "endpointslice", "ingress"}
    for job in config.get("scrape_configs", []):
        for sd in job.pop("kubernetes_sd_configs", []):
            assert set(sd) <= {"role", "namespaces", "selectors", "api_server", "attach_metadata"}, sd
            assert sd["role"] in allowed_roles
            assert all(isinstance(n, str) for n in sd.get("namespaces", {}).get("names", []))
            job.setdefault("static_configs", []).append({"targets": ["127.0.0.1:9402"]})
    return config


@pytest.mark.parametrize("path", PROMETHEUS_EXAMPLES, ids=lambda p: p.name)
def test_example_prometheus_configs_pass_promtool(path: Path, tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    config = kubernetes_sd_as_static(yaml.safe_load(path.read_text()))
    # Rule files are relative to the config: give them the shipped rules.
    for pattern in config.get("rule_files", []):
        target = tmp_path / pattern
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "alerts" / "fleetscope.rules.yml", target)
    checked = tmp_path / path.name
    checked.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(checked)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_examples_cover_static_ec2_and_amp() -> None:
    configs = {p.name: yaml.safe_load(p.read_text()) for p in PROMETHEUS_EXAMPLES}
    discovery = {name: {key for job in c["scrape_configs"] for key in job if key.endswith("_configs")}
                 for name, c in configs.items()}
    assert any("static_configs" in d for d in discovery.values())
    assert any("ec2_sd_configs" in d for d in discovery.values())
    amp = [c for c in configs.values() if any("sigv4" in rw for rw in c.get("remote_write", []))]
    assert amp and re.search(r"/workspaces/[^/]+/api/v1/remote_write$", amp[0]["remote_write"][0]["url"])
    for name, config in configs.items():
        jobs = {job["job_name"] for job in config["scrape_configs"]}
        assert "fleetscope" in jobs, f"{name}: the rules select job=\"fleetscope\""


def _fleetscope_jobs(path: Path) -> list[dict[str, Any]]:
    config = yaml.safe_load(path.read_text())
    return [job for job in config.get("scrape_configs", []) if job["job_name"] == "fleetscope"]


@pytest.mark.parametrize("path", [*PROMETHEUS_EXAMPLES, REPO / "deploy" / "compose" / "prometheus.yml"],
                         ids=lambda p: p.name)
def test_every_shipped_scrape_drops_the_names_a_push_could_forge(path: Path) -> None:
    """Defence in depth beside the push API's refusal (#35 items 1 and 2)."""
    from fleetscope.push.textformat import RESERVED_NAMES_REGEX
    jobs = _fleetscope_jobs(path)
    assert jobs
    for job in jobs:
        assert {"source_labels": ["__name__"], "regex": RESERVED_NAMES_REGEX, "action": "drop"} in job.get(
            "metric_relabel_configs", []), path


def test_the_kubernetes_monitors_and_the_simulators_prometheus_drop_them_too() -> None:
    from fleetscope.push.textformat import RESERVED_NAMES_REGEX
    from fleetscope_sim.cluster import make_cluster
    from fleetscope_sim.prom import prometheus_config
    monitor = yaml.safe_load((REPO / "deploy" / "kubernetes" / "components" / "prometheus-operator" /
                              "servicemonitor.yaml").read_text())
    [endpoint] = monitor["spec"]["endpoints"]
    assert {"sourceLabels": ["__name__"], "regex": RESERVED_NAMES_REGEX, "action": "drop"} in endpoint[
        "metricRelabelings"]
    [job] = prometheus_config(make_cluster(nodes=2), [])["scrape_configs"]
    assert {"source_labels": ["__name__"], "regex": RESERVED_NAMES_REGEX, "action": "drop"} in job[
        "metric_relabel_configs"]


def test_the_drop_regex_is_what_the_push_api_refuses() -> None:
    from fleetscope.push.textformat import RESERVED_NAMES_REGEX, reserved
    names = ["ALERTS", "ALERTS_FOR_STATE", "up", "scrape_duration_seconds", "a:b", "training_job:x:hung",
             "upx", "alerts", "my_up", "node_scrape_x", "fleetscope_training_steps_total", "m"]
    dropped = {name for name in names if re.fullmatch(RESERVED_NAMES_REGEX, name)}
    refused = {name for name in names if reserved(name)}
    assert dropped == refused - {"fleetscope_training_steps_total"}  # the node's own series are scraped
    assert dropped == {"ALERTS", "ALERTS_FOR_STATE", "up", "scrape_duration_seconds", "a:b", "training_job:x:hung"}
