"""node-problem-detector beside the daemon: its plugin monitor config, the overlay's wiring and the plugin.

The config's field names and rules are node-problem-detector's (pkg/custompluginmonitor/types/config.go
and its ApplyConfiguration/Validate): a misspelled key is silently ignored by its JSON decoder, so this
test refuses unknown keys the way a typo would need to be caught.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fleetscope import __version__
from fleetscope.check.run import MESSAGE_LIMIT
from fleetscope.check.verdicts import CONDITIONS
from fleetscope.cli import build_parser, config_from_args, main
from tests.deploy.manifests import KUSTOMIZE_DIR, kustomize, one

COMPONENT = KUSTOMIZE_DIR / "components" / "node-problem-detector"
MONITOR = COMPONENT / "fleetscope-monitor.json"
PLUGIN = COMPONENT / "verdict.sh"

# node-problem-detector's custom plugin monitor schema (json tags of CustomPluginConfig, its
# pluginGlobalConfig, types.Condition and CustomRule).
TOP_LEVEL = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}
PLUGIN_CONFIG = {"invoke_interval", "timeout", "max_output_length", "concurrency",
                 "enable_message_change_based_condition_update", "skip_initial_status"}
CONDITION = {"type", "reason", "message"}
RULE = {"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"}
GO_DURATION = re.compile(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+")
SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def go_seconds(text: str) -> float:
    assert GO_DURATION.fullmatch(text), f"{text!r} is no Go duration (time.ParseDuration)"
    return sum(float(n) * SECONDS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(ns|us|µs|ms|s|m|h)", text))


def strict_json(path: Path) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate keys in {path.name}: {keys}"
        return dict(pairs)

    return json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=no_duplicates)


@pytest.fixture(scope="module")
def monitor() -> dict[str, Any]:
    return strict_json(MONITOR)


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return kustomize(KUSTOMIZE_DIR / "overlays" / "node-problem-detector")


def containers(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def test_monitor_config_holds_the_custom_plugin_schema(monitor: dict[str, Any]) -> None:
    assert set(monitor) <= TOP_LEVEL and {"plugin", "pluginConfig", "source", "conditions", "rules"} <= set(monitor)
    assert monitor["plugin"] == "custom"
    config = monitor["pluginConfig"]
    assert set(config) <= PLUGIN_CONFIG
    assert {"invoke_interval", "timeout", "max_output_length", "concurrency"} <= set(config)
    assert go_seconds(config["invoke_interval"]) > 0
    timeout = go_seconds(config["timeout"])
    assert timeout <= 5, "node-problem-detector's default plugin timeout; the plugin answers at once"
    assert config["max_output_length"] == MESSAGE_LIMIT, "check cuts its line where NPD does"
    assert isinstance(config["concurrency"], int) and config["concurrency"] >= 1
    for condition in monitor["conditions"]:
        assert set(condition) == CONDITION and all(condition.values())
    for rule in monitor["rules"]:
        assert set(rule) <= RULE and {"type", "reason", "path"} <= set(rule)
        assert rule["type"] in ("temporary", "permanent")
        if rule["type"] == "permanent":  # NPD's Validate: a permanent rule's condition must be preset
            assert rule["condition"] in {c["type"] for c in monitor["conditions"]}
        assert go_seconds(rule["timeout"]) <= timeout, "NPD refuses a rule timeout above the global one"
        assert all(isinstance(a, str) for a in rule["args"])


def test_monitor_conditions_are_fleetscopes(monitor: dict[str, Any]) -> None:
    assert monitor["conditions"] == [
        {"type": c.type, "reason": c.healthy_reason, "message": c.healthy_message} for c in CONDITIONS.values()]
    rules = {rule["args"][0]: rule for rule in monitor["rules"]}
    assert set(rules) == set(CONDITIONS)
    for name, rule in rules.items():
        assert (rule["type"], rule["condition"], rule["reason"]) == (
            "permanent", CONDITIONS[name].type, CONDITIONS[name].problem_reason)
        # The verdict may be this old before it counts as stale: more than two rounds of the writer.
        assert int(rule["args"][1]) >= 2 * 30 + 10


def test_overlay_runs_npd_and_the_verdict_writer_beside_the_daemon(
    rendered: list[dict[str, Any]], monitor: dict[str, Any], tmp_path: Path
) -> None:
    pod = one(rendered, "DaemonSet")["spec"]["template"]["spec"]
    by_name = containers(rendered)
    assert set(by_name) == {"fleetscope", "verdicts", "npd"}
    daemon, writer, npd = by_name["fleetscope"], by_name["verdicts"], by_name["npd"]
    assert writer["image"] == daemon["image"] and writer["image"] == f"localhost/fleetscope:{__version__}"
    assert npd["image"].startswith("registry.k8s.io/node-problem-detector/node-problem-detector:v")

    # The writer's command line is fleetscope's own, and its settings load.
    env = {e["name"]: e for e in writer["env"]}
    assert env["FLEETSCOPE_CHECK_INSTANCE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    args = build_parser().parse_args([a for a in writer["args"] if not a.startswith("--config=")])
    assert args.command == "check" and args.every == 30
    config = config_from_args(args)
    assert (config.path.sysfs, config.path.procfs) == ("/host/sys", "/host/proc")
    url = env["FLEETSCOPE_CHECK_PROMETHEUS_URL"]["value"]
    assert url.startswith("http") and url == url.strip()

    # The directory the writer writes is the one NPD's plugin reads, read-only there.
    mounts = {c: {m["name"]: m for m in by_name[c]["volumeMounts"]} for c in by_name}
    assert mounts["verdicts"]["verdicts"]["mountPath"] == args.write
    assert mounts["npd"]["verdicts"]["mountPath"] == args.write and mounts["npd"]["verdicts"]["readOnly"]
    assert {e["name"]: e.get("value") for e in npd["env"]}["FLEETSCOPE_VERDICTS"] == args.write

    # NPD loads the monitor from its mount and runs the plugin where the rules say.
    (flag,) = [a for a in npd["command"] if a.startswith("--config.custom-plugin-monitor=")]
    files = {m["mountPath"]: m["subPath"] for m in npd["volumeMounts"] if m["name"] == "npd-config"}
    assert files[flag.split("=", 1)[1]] == MONITOR.name
    assert {files[rule["path"]] for rule in monitor["rules"]} == {PLUGIN.name}
    volume = next(v for v in pod["volumes"] if v["name"] == "npd-config")
    assert volume["configMap"]["defaultMode"] & 0o111, "the plugin must be executable"
    configmap = next(c for c in rendered if c["kind"] == "ConfigMap" and c["metadata"]["name"] ==
                     volume["configMap"]["name"])
    assert json.loads(configmap["data"][MONITOR.name]) == monitor
    assert configmap["data"][PLUGIN.name] == PLUGIN.read_text()

    # Only NPD holds a token, and its service account may do what NPD's bootstrap role allows.
    assert pod["automountServiceAccountToken"] is False
    assert [c for c in by_name if "npd-token" in mounts[c]] == ["npd"]
    assert mounts["npd"]["npd-token"]["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    binding = one(rendered, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "system:node-problem-detector"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": one(rendered, "DaemonSet")["metadata"]["namespace"]}]
    for container in (writer, npd):
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
        assert security["capabilities"] == {"drop": ["ALL"]}


# -- the plugin, as node-problem-detector runs it, on files the real writer wrote ---------------------


def run_plugin(directory: Path, condition: str, max_age: str = "120") -> tuple[int, str]:
    result = subprocess.run(["bash", str(PLUGIN), condition, max_age], capture_output=True, text=True, timeout=10,
                            env={"PATH": os.environ["PATH"], "FLEETSCOPE_VERDICTS": str(directory)}, check=False)
    return result.returncode, result.stdout


def test_plugin_reports_what_check_wrote(tmp_path: Path, capsys) -> None:
    fixtures = KUSTOMIZE_DIR.parent.parent / "tests" / "fixtures"
    flags = ["--path.sysfs", str(fixtures / "malformed" / "sys"), "--no-collector.gpu"]
    verdicts = tmp_path / "verdicts"
    assert main(["check", "--write", str(verdicts), *flags]) == 0
    for name in CONDITIONS:
        code = main(["check", "--condition", name, *flags])
        direct = capsys.readouterr().out
        assert run_plugin(verdicts, name) == (code, direct), name
    assert run_plugin(verdicts, "efa") == (1, "efa rdmap160s27: port 1 is DOWN, not ACTIVE (+1 more)\n")
    assert run_plugin(verdicts, "training")[0] == 2


def test_plugin_never_reports_a_stale_or_missing_verdict(tmp_path: Path) -> None:
    (tmp_path / "gpu").write_text("1\ngpu 3: lost\n")
    assert run_plugin(tmp_path, "gpu") == (1, "gpu 3: lost\n")
    old = time.time() - 600
    os.utime(tmp_path / "gpu", (old, old))
    code, out = run_plugin(tmp_path, "gpu")
    assert code == 2 and out.startswith("stale fleetscope verdict (") and len(out) <= MESSAGE_LIMIT + 1
    code, out = run_plugin(tmp_path, "efa")
    assert code == 2 and out == "no fleetscope verdict yet: is the verdicts container running?\n"
    (tmp_path / "training").write_text("7\nsomething odd\n")
    assert run_plugin(tmp_path, "training") == (2, "something odd\n")
    assert run_plugin(tmp_path, "../gpu")[0] == 2


def test_plugin_does_not_serve_a_verdict_dated_in_the_future(tmp_path: Path) -> None:
    """A clock set back made a verdict file's age negative: it read as fresh for as long as the step (#35)."""
    (tmp_path / "gpu").write_text("1\ngpu 3: lost\x1b[2J\n")
    assert run_plugin(tmp_path, "gpu") == (1, "gpu 3: lost [2J\n")
    ahead = time.time() + 3600
    os.utime(tmp_path / "gpu", (ahead, ahead))
    code, out = run_plugin(tmp_path, "gpu")
    assert code == 2 and out.startswith("fleetscope verdict dated 3") and "in the future" in out
    assert len(out) <= MESSAGE_LIMIT + 1
