"""Cross-node verdicts end to end: a real Prometheus evaluates the real rules over a planted history, and the
real ``fleetscope check`` (and the Slurm health check around it) acts on what it says about each node.

The history is what the straggler rule records (``NODE_JOB_STRAGGLERS``: a node's ranks flagged in a
job), backfilled with ``promtool tsdb create-blocks-from openmetrics`` for the last days; the
repeat-offender rule and the breaker alert then run live, every second, with the production windows
(7 days, 10 minutes). The nodes are scrape targets that refuse connections: ``up`` is 0, but they are the
cluster's nodes all the same, which is all the breaker counts.

Cluster a: ten nodes, a03 slow in three jobs over five days (a repeat straggler). Cluster b: ten nodes,
three of them repeat stragglers: more than 20% (two nodes), so the breaker holds the finding back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from fleetscope.check.run import EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNKNOWN
from fleetscope.cli import main
from fleetscope.promql import NODE_JOB_STRAGGLERS
from fleetscope.rules.render import groups_dict
from fleetscope.rules.settings import PRODUCTION
from fleetscope_sim.harness import Prometheus, eventually
from tests.conftest import ROOT, require_binary
from tests.deploy.test_slurm import FakeNode

pytestmark = [pytest.mark.live, pytest.mark.slow]

CLUSTERS = {"a": [f"a{i:02d}" for i in range(10)], "b": [f"b{i:02d}" for i in range(10)]}
OFFENDERS = {"a03", "b00", "b01", "b02"}
DAY = 86400
# Rules as in production, evaluated every second instead of every 3 or 10 minutes (their counts do not
# depend on it), and only the groups under test.
SETTINGS = dataclasses.replace(PRODUCTION, evaluation_interval="1s", slow_evaluation_interval="1s",
                               repeat_interval="1s")
GROUPS = {"fleetscope-repeat-offenders", "fleetscope"}


def planted_history(now: float) -> str:
    """OpenMetrics: each offender's ranks flagged for 30 minutes in three jobs, 1, 3 and 5 days ago."""
    lines = [f"# TYPE {NODE_JOB_STRAGGLERS} gauge"]
    for cluster, nodes in CLUSTERS.items():
        for node in sorted(OFFENDERS & set(nodes)):
            for job, days_ago in (("llama-1", 5), ("llama-2", 3), ("llama-3", 1)):
                start = int(now - days_ago * DAY)
                labels = f'cluster="{cluster}",instance="{node}",training_job="{job}"'
                lines += [f"{NODE_JOB_STRAGGLERS}{{{labels}}} 1 {start + 60 * m}" for m in range(30)]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_binary("prometheus")
    promtool = require_binary("promtool")
    work = tmp_path_factory.mktemp("verdicts")
    history = work / "history.om"
    history.write_text(planted_history(time.time()))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(history), str(work / "data")],
                   check=True, capture_output=True, timeout=120)
    groups = [g for g in groups_dict(SETTINGS) if g["name"] in GROUPS]
    assert {g["name"] for g in groups} == GROUPS
    (work / "rules.yml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    with refusing_address() as refused:  # nothing listens: every node's `up` is 0
        targets = [{"targets": [refused], "labels": {"cluster": cluster, "instance": node}}
                   for cluster, nodes in CLUSTERS.items() for node in nodes]
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(work / "rules.yml")],
            "scrape_configs": [{"job_name": "fleetscope", "static_configs": targets}],
        }
        server = Prometheus(work, retention="30d")  # its data directory, work/data, holds the planted history
        try:
            server.start(config)
            breaker = 'ALERTS{alertname="FleetscopeBreakerTripped", alertstate="firing"}'
            eventually(lambda: server.query(breaker), 180, "the breaker alert to fire", interval=0.5)
            yield server.url
        finally:
            server.stop()


@contextmanager
def refusing_address() -> Iterator[str]:
    """host:port of a socket bound and never listening: a connection there is refused, and the port stays ours."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        host, port = sock.getsockname()
        yield f"{host}:{port}"


# How long check may take, and wait for Prometheus: a guard, not the defaults. The verdicts are the claim here,
# and this Prometheus shares a loaded machine with other tests. Both defaults cap the exchange: `--condition`'s
# whole check has 3 s (node-problem-detector kills a plugin at 5), the HTTP client's import and setup included
# (0.56 CPU-s cold), and a test worker's share of a busy machine did not finish in it ("could not tell").
# The defaults' deadlines ("could not tell" past them) are the gate's (tests/check/).
GUARD_SECONDS = 30
PROMETHEUS_TIMEOUT = f"{GUARD_SECONDS}s"


def check(capsys: pytest.CaptureFixture[str], instance: str, url: str) -> tuple[int, str]:
    code = main(["check", "--condition", "training", "--timeout", str(GUARD_SECONDS), "--check.prometheus-url", url,
                 "--check.instance", instance, "--check.prometheus-timeout", PROMETHEUS_TIMEOUT])
    return code, capsys.readouterr().out


def test_repeat_offender_is_marked_with_the_finding_in_its_message(prometheus: str, capsys) -> None:
    code, out = check(capsys, "a03", prometheus)
    assert code == EXIT_UNHEALTHY
    (line,) = out.splitlines()
    assert line == "repeat straggler (3 jobs)" and len(line) <= 80


def test_healthy_node_is_not_marked(prometheus: str, capsys) -> None:
    assert check(capsys, "a04", prometheus) == (EXIT_HEALTHY, "healthy\n")


def test_breaker_holds_back_a_finding_on_more_than_a_fifth_of_the_nodes(prometheus: str, capsys) -> None:
    code, out = check(capsys, "b01", prometheus)
    assert (code, out) == (EXIT_UNKNOWN, "could not tell: breaker: repeat straggler on 3 of 10 nodes (>2)\n")
    with urllib.request.urlopen(f"{prometheus}/api/v1/alerts", timeout=5) as answer:
        alerts = json.load(answer)["data"]["alerts"]
    (alert,) = [a for a in alerts if a["labels"]["alertname"] == "FleetscopeBreakerTripped"]
    assert (alert["state"], alert["labels"]["cluster"], alert["labels"]["finding"]) == (
        "firing", "b", "TrainingNodeRepeatedlySlow")
    assert alert["annotations"]["description"].startswith("3 nodes of cluster b carried TrainingNodeRepeatedlySlow")


def test_prometheus_down_or_ignorant_of_the_node_is_could_not_tell(prometheus: str, capsys) -> None:
    with refusing_address() as nobody:
        code, out = check(capsys, "a03", f"http://{nobody}")
    assert code == EXIT_UNKNOWN and out.startswith("could not tell: Prometheus unreachable")
    code, out = check(capsys, "a99", prometheus)
    assert (code, out) == (EXIT_UNKNOWN, "could not tell: Prometheus has no target instance=a99 (check.instance?)\n")


def test_slurm_drains_the_repeat_offender_naming_the_finding(prometheus: str, tmp_path: Path) -> None:
    """deploy/slurm/healthcheck.sh around the real `fleetscope check`, with the node's collectors off."""
    slurm = FakeNode(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "collector": {name: {"enabled": False} for name in ("efa", "netdev", "netstat", "ena", "gpu", "nccl")},
        "check": {"prometheus-url": prometheus, "instance": "a03", "repaired-file": str(tmp_path / "repaired"),
                  "prometheus-timeout": PROMETHEUS_TIMEOUT},
    }))
    command = slurm.bin / "fleetscope"
    command.write_text(f'#!/bin/sh\nPYTHONPATH="{os.path.join(ROOT, "exporter")}" exec "{sys.executable}" '
                       '-m fleetscope "$@"\n')
    command.chmod(0o755)
    slurm.set_node("IDLE")
    drain = "update NodeName=gpu-st-1 State=DRAIN Reason=fleetscope: training: repeat straggler (3 jobs)"
    # The script's own deadline (45 s by default) above check's, below run_healthcheck's 60 s.
    deadline = "55"
    assert slurm.run_healthcheck(FLEETSCOPE_CHECK_CONFIG=str(config), FLEETSCOPE_CHECK_TIMEOUT=deadline) == [drain]
    slurm.set_node("IDLE+DRAIN", "fleetscope: training: repeat straggler (3 jobs)")
    # Repaired in place: the operator touches the repaired file; the days of history no longer count until
    # the node is flagged again, and fleetscope resumes the node it drained.
    (tmp_path / "repaired").touch()
    resume = "update NodeName=gpu-st-1 State=RESUME"
    assert slurm.run_healthcheck(FLEETSCOPE_CHECK_CONFIG=str(config), FLEETSCOPE_CHECK_TIMEOUT=deadline) == [
        drain, resume]
