"""The container image, built by ``bash scripts/image`` and run the way the DaemonSet runs it.

The build is the script a user runs, with podman (on a machine without a reachable container registry it
builds its Debian base first, minutes the first time, then kept). The daemon then runs in the image with
what the DaemonSet's pod spec asks for, read from ``deploy/kubernetes/base/daemonset.yaml``: its
arguments, a read-only root filesystem, every capability dropped, no privilege escalation, the host's
network and PID namespaces, its user, and its volume mounts (the node's /sys and /proc as a fixture node's
trees, the configuration as the ConfigMap's file, the NCCL Inspector directory, /tmp in memory). Only the
listen address differs: loopback and a free port, because the host's 9402 may be taken on a shared machine.
The host scrapes ``/metrics``, and ``fleetscope check`` runs inside the running container.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from prometheus_client.parser import text_string_to_metric_families

from fleetscope import __version__
from tests.conftest import free_port, require_binary
from tests.deploy.manifests import KUSTOMIZE_DIR, REPO

pytestmark = [pytest.mark.late, pytest.mark.timeout(1800)]

IMAGE = f"localhost/fleetscope:{__version__}"
FIXTURE = REPO / "tests" / "fixtures" / "p5"
DOCKERFILE = REPO / "deploy" / "container" / "Dockerfile"
CONTAINERS_CONF = REPO / "deploy" / "container" / "containers.conf"
# What the image weighs uncompressed, at most: the base (Debian 12 with python3, about 130 MB, as the
# official slim image) and the daemon's virtual environment (about 27 MB).
SIZE_LIMIT = 200_000_000


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([require_binary("podman"), *args], capture_output=True, text=True, timeout=timeout,
                            check=False, env=podman_env())
    if check:
        assert result.returncode == 0, f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    """``bash scripts/image`` as a user runs it; its closing line and the image's configuration."""
    started = time.monotonic()
    result = subprocess.run(["bash", str(REPO / "scripts" / "image")], capture_output=True, text=True, timeout=1500,
                            check=False, cwd=REPO)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    summary = re.search(r"scripts/image: (\S+) on (\S+), (\d+) MB, built in (\d+) s", result.stderr)
    assert summary is not None, result.stderr[-3000:]
    print(f"scripts/image: {seconds:.0f} s in all; {summary.group(0)}")  # shown with -s
    (inspected,) = json.loads(podman("image", "inspect", IMAGE).stdout)
    return {"summary": summary, "inspect": inspected, "log": result.stderr}


def _pod_spec() -> dict[str, Any]:
    daemonset = yaml.safe_load((KUSTOMIZE_DIR / "base" / "daemonset.yaml").read_text())
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def daemonset_run_args(port: int, scratch: Path) -> list[str]:
    """``podman run`` arguments for the DaemonSet's fleetscope container, on the fixture node."""
    pod = _pod_spec()
    (container,) = [c for c in pod["containers"] if c["name"] == "fleetscope"]
    security = container["securityContext"]
    args = ["--user", f"{security['runAsUser']}:{security['runAsGroup']}"]
    assert pod["hostNetwork"] and pod["hostPID"]
    args += ["--network", "host", "--pid", "host"]
    assert security["readOnlyRootFilesystem"] and security["capabilities"]["drop"] == ["ALL"]
    assert not security["privileged"] and not security["allowPrivilegeEscalation"]
    assert "add" not in security["capabilities"]
    args += ["--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges"]
    # The pod's volumes, each as the node would give it.
    config_dir = scratch / "config"
    config_dir.mkdir()
    (config_dir / "config.yaml").write_text((KUSTOMIZE_DIR / "base" / "config.yaml").read_text())
    nccl = scratch / "nccl-inspector"
    nccl.mkdir(mode=0o1777)
    host_paths = {"/sys": FIXTURE / "sys", "/proc": FIXTURE / "proc", "/var/lib/fleetscope/nccl-inspector": nccl}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        suffix = ":ro" if mount.get("readOnly") else ""
        if "configMap" in volume:
            args += ["--volume", f"{config_dir}:{mount['mountPath']}{suffix}"]
        elif "hostPath" in volume:
            args += ["--volume", f"{host_paths[volume['hostPath']['path']]}:{mount['mountPath']}{suffix}"]
        elif "emptyDir" in volume:
            assert volume["emptyDir"]["medium"] == "Memory"
            args += ["--tmpfs", f"{mount['mountPath']}:rw,size={volume['emptyDir']['sizeLimit'].removesuffix('i')}"]
        else:
            raise AssertionError(f"no stand-in for volume {volume}")
    for env in container["env"]:
        if "value" in env:
            args += ["--env", f"{env['name']}={env['value']}"]
        else:  # the push token Secret is optional: absent here
            assert env["valueFrom"]["secretKeyRef"]["optional"] is True
    command = [a for a in container["args"] if not a.startswith("--web.listen-address=")]
    assert len(command) == len(container["args"]) - 1
    return [*args, IMAGE, *command, f"--web.listen-address=127.0.0.1:{port}"]


@pytest.fixture(scope="module")
def daemon(built: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    port = free_port()
    name = f"fleetscope-test-{os.getpid()}"
    podman("run", "--detach", "--rm", "--name", name, *daemonset_run_args(port, tmp_path_factory.mktemp("pod")))
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            running = podman("container", "inspect", "--format", "{{.State.Running}}", name, check=False)
            if running.stdout.strip() != "true" or time.monotonic() > deadline:
                logs = podman("logs", name, check=False)
                pytest.fail(f"the daemon in the image did not get ready:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")
            time.sleep(0.5)
        yield name, port
    finally:
        podman("rm", "--force", "--time", "5", name, check=False)


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = require_binary("hadolint")
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_lock_pins_every_dependency_with_hashes() -> None:
    """The lock files answer pyproject.toml: every requirement pinned to a version it allows, with hashes."""
    with (REPO / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)

    def pins(name: str) -> dict[str, str]:
        text = (REPO / "deploy" / "container" / name).read_text()
        entries = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", text,
                             re.MULTILINE)
        assert len(entries) == len(re.findall(r"^\S+==", text, re.MULTILINE)), name  # each one hashed
        return {n.lower().replace("_", "-"): version for n, version, _ in entries}

    for requirements, lock in ((project["project"]["dependencies"], "requirements.lock"),
                               (project["build-system"]["requires"], "build-requirements.lock")):
        pinned = pins(lock)
        for line in requirements:
            requirement = Requirement(line)
            name = requirement.name.lower().replace("_", "-")
            assert name in pinned, (lock, line)
            assert requirement.specifier.contains(pinned[name]), (lock, line, pinned[name])


def test_scripts_image_builds_this_version(built: dict[str, Any]) -> None:
    summary, inspected = built["summary"], built["inspect"]
    assert summary.group(1) == IMAGE
    assert int(summary.group(3)) * 1_000_000 <= SIZE_LIMIT, summary.group(0)
    labels = inspected["Config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.title"] == "fleetscope"
    assert re.fullmatch(r"[0-9a-f]{40}", labels["org.opencontainers.image.revision"])
    assert inspected["Config"]["User"] == "65532:65532"  # numeric and not root, where the deployment allows it
    assert inspected["Config"]["Entrypoint"] == ["fleetscope"]
    version = podman("run", "--rm", "--read-only", "--cap-drop=ALL", IMAGE, "--version")
    assert version.stdout.strip() == f"fleetscope {__version__}"


def test_the_image_holds_only_the_locked_packages(built: dict[str, Any]) -> None:
    listed = podman("run", "--rm", "--read-only", "--entrypoint", "python3", IMAGE, "-c",
                    "import importlib.metadata as m, json; "
                    "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))")
    installed = json.loads(listed.stdout)
    lock = (REPO / "deploy" / "container" / "requirements.lock").read_text()
    locked = {n.lower().replace("_", "-"): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) ", lock, re.MULTILINE)}
    assert installed.pop("fleetscope") == __version__
    assert {n.replace("_", "-"): v for n, v in installed.items()} == locked  # no pip, no setuptools, nothing else


def test_the_daemon_serves_metrics_read_only_without_capabilities(daemon: tuple[str, int]) -> None:
    name, port = daemon
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    (info,) = [s for s in samples if s.name == "fleetscope_build_info"]
    assert info.labels["version"] == __version__
    success = {s.labels["collector"]: s.value for s in samples if s.name == "fleetscope_collector_success"}
    assert success["efa"] == 1 and success["netdev"] == 1, success
    value = {s.name: s.value for s in samples if not s.labels}
    # The fixture node's 32 EFA devices, read through the read-only /host/sys mount.
    assert value["fleetscope_efa_devices"] == 32
    # Its own process, as prometheus_client reports it.
    assert value["process_resident_memory_bytes"] > 10_000_000 and value["process_open_fds"] > 0
    # Nothing runs with a capability: the process's effective set is empty.
    status = podman("exec", name, "python3", "-c", "print(open('/proc/self/status').read())").stdout
    assert re.search(r"^CapEff:\s+0+$", status, re.MULTILINE), status


def test_check_runs_inside_the_running_container(daemon: tuple[str, int]) -> None:
    name, _ = daemon
    paths = ("--config=/etc/fleetscope/config.yaml", "--path.sysfs=/host/sys", "--path.procfs=/host/proc",
             "--no-collector.gpu")
    healthy = podman("exec", name, "fleetscope", "check", *paths, "--efa.expected-count=32", check=False)
    assert (healthy.returncode, healthy.stdout.strip().splitlines()[-1]) == (0, "HEALTHY"), healthy
    short = podman("exec", name, "fleetscope", "check", *paths, "--efa.expected-count=33", check=False)
    assert short.returncode == 1 and "32" in short.stdout and "33" in short.stdout, short


def test_the_unprivileged_user_reads_the_node(built: dict[str, Any]) -> None:
    """The image's own user (65532) with the same restrictions: sysfs counters and /proc are world-readable."""
    check = podman("run", "--rm", "--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges",
                   "--volume", f"{FIXTURE / 'sys'}:/host/sys:ro", "--volume", f"{FIXTURE / 'proc'}:/host/proc:ro",
                   IMAGE, "check", "--path.sysfs=/host/sys", "--path.procfs=/host/proc", "--no-collector.gpu",
                   "--efa.expected-count=32", check=False)
    assert (check.returncode, check.stdout.strip().splitlines()[-1]) == (0, "HEALTHY"), check
