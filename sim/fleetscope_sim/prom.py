"""The configuration of a local Prometheus (and Alertmanager, when installed) watching a simulated cluster.

The binaries are the distribution's (Debian ``prometheus``, ``prometheus-alertmanager``); the processes are
:mod:`fleetscope_sim.harness`'s, re-exported here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from fleetscope.push.textformat import RESERVED_NAMES_REGEX
from fleetscope_sim.cluster import ClusterSpec
from fleetscope_sim.harness import Alertmanager, Prometheus

__all__ = ["Alertmanager", "Prometheus", "alertmanager_available", "find_binary", "prometheus_config"]


def find_binary(name: str) -> str | None:
    return shutil.which(name)


def prometheus_config(
    cluster: ClusterSpec,
    rule_files: Sequence[str],
    scrape_interval: float = 5.0,
    alertmanager: str | None = None,
    addresses: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Scrape every simulated node; ``instance`` is the node's name, as a real node's hostname would be.

    ``addresses`` are the ones the node daemons bound (:attr:`SimCluster.addresses`); without, the spec's ports."""
    interval = f"{scrape_interval:g}s"
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [os.path.abspath(p) for p in rule_files],
        "scrape_configs": [{
            "job_name": "fleetscope",
            "static_configs": [
                {"targets": [(addresses or {}).get(node.name, f"{cluster.host}:{node.port}")],
                 "labels": {"instance": node.name, "instance_type": node.profile.instance_type}}
                for node in cluster.nodes
            ],
            # The names a push could forge, dropped at the scrape as the shipped configs do (issue 35).
            "metric_relabel_configs": [
                {"source_labels": ["__name__"], "regex": RESERVED_NAMES_REGEX, "action": "drop"},
            ],
        }],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config


def alertmanager_available() -> bool:
    return bool(find_binary("prometheus-alertmanager") or find_binary("alertmanager"))
