"""Cross-node findings about this node, from Prometheus: ``fleetscope check``'s ``training`` condition.

Some verdicts only Prometheus can make, because they compare nodes: this node
is a repeat straggler, its ranks are a job's stragglers for a cause on the
node, NcclLateRank names one of its ranks. ``check`` asks Prometheus's HTTP
API (``/api/v1/query``) for the firing alerts of
:data:`fleetscope.check.verdicts.FINDINGS` about its own ``instance``, with a short
timeout, and reports them; then, for each one found, how many of the
cluster's nodes carry the same finding (the circuit breaker).

Whatever goes wrong on the way (Prometheus unreachable, an error answer, this
node unknown to it) is "could not tell", never "unhealthy": a broken
monitoring path must not mark a node.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from fleetscope.check.verdicts import (
    FINDINGS_BY_ALERT,
    NODE_CAUSES,
    REPEAT_COUNTS,
    NodeFinding,
    allowed_nodes,
    breaker_tripped,
    duration,
    findings_about,
    nodes_carrying,
    nodes_scraped,
    quote,
)
from fleetscope.collectors.protocol import Finding
from fleetscope.config import CheckConfig

logger = logging.getLogger(__name__)

SOURCE = "training"  # the findings' `collector`: the condition they belong to
MAX_ANSWER_BYTES = 4 << 20  # an answer about one node is a few kB; more is not Prometheus answering us


class PrometheusError(Exception):
    """Prometheus could not be asked, or did not answer with a result."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


class PrometheusApi:
    """Instant queries against one Prometheus-compatible HTTP API, each within what is left of a deadline."""

    def __init__(self, url: str, deadline: float) -> None:
        self.url = url
        self.deadline = deadline
        # Never through a proxy from the environment: the query goes where check.prometheus-url says.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def query(self, expr: str) -> list[Sample]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise PrometheusError("no answer in time")
        request = urllib.request.Request(
            f"{self.url}/api/v1/query", data=urllib.parse.urlencode({"query": expr}).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
        )
        try:
            with self._opener.open(request, timeout=left) as response:
                body = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"HTTP {exc.code} {_error_of(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(f"unreachable: {reason}") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise PrometheusError("answer too large")
        return _vector(body)


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read(4096)).get("error", exc.reason))[:120]
    except (ValueError, AttributeError, OSError):
        return str(exc.reason)


def _vector(body: bytes) -> list[Sample]:
    try:
        answer: Any = json.loads(body)
        if answer.get("status") != "success":
            raise PrometheusError(f"error answer: {str(answer.get('error'))[:120]}")
        data = answer["data"]
        if data["resultType"] != "vector":
            raise PrometheusError(f"expected a vector, got {data['resultType']}")
        return [Sample({str(k): str(v) for k, v in item["metric"].items()}, float(item["value"][1]))
                for item in data["result"]]
    except PrometheusError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        raise PrometheusError("not a Prometheus query answer") from None


def own_instance(config: CheckConfig) -> str:
    """The node's ``instance`` label: the setting, else the short host name (the shipped scrape configs)."""
    return config.instance or socket.gethostname().split(".", 1)[0]


def cross_node_findings(config: CheckConfig, deadline: float) -> list[Finding]:
    """The node's eligible cross-node findings: unhealthy, or unknown where the breaker holds them back."""
    if not config.prometheus_url:
        return [Finding(SOURCE, "unknown", "", "check.prometheus-url is not set")]
    api = PrometheusApi(config.prometheus_url, min(deadline, time.monotonic() + config.prometheus_timeout))
    instance = own_instance(config)
    try:
        return _ask(api, config, instance)
    except PrometheusError as exc:
        return [Finding(SOURCE, "unknown", "", f"Prometheus {exc}")]


def _ask(api: PrometheusApi, config: CheckConfig, instance: str) -> list[Finding]:
    # One question in the common case (no finding): is the node a target Prometheus knows (a wrong
    # check.instance would otherwise read as healthy), and which findings name it.
    answer = api.query(f"up{{{config.selector}, instance={quote(instance)}}}\nor\n{findings_about(instance)}")
    targets = [s for s in answer if s.labels.get("__name__") == "up"]
    clusters = sorted({s.labels.get("cluster", "") for s in targets})
    if not clusters:
        return [Finding(SOURCE, "unknown", "", f"Prometheus has no target instance={instance} (check.instance?)")]
    if len(clusters) > 1:
        return [Finding(SOURCE, "unknown", "", f"instance {instance} is in {len(clusters)} clusters: "
                        "add cluster=... to check.selector")]
    cluster = clusters[0]
    found: dict[str, list[Sample]] = {}
    for sample in answer:
        alert = sample.labels.get("alertname", "")
        if alert in FINDINGS_BY_ALERT and sample.labels.get("cluster", "") == cluster:
            found.setdefault(alert, []).append(sample)
    if not found:
        return []
    scope = f"{config.selector}, cluster={quote(cluster)}"
    nodes = _count(api, nodes_scraped(scope, config.breaker_window))
    if nodes == 0:
        return [Finding(SOURCE, "unknown", "", "Prometheus counts no fleetscope nodes to weigh findings against")]
    own = f"instance={quote(instance)}, cluster={quote(cluster)}"
    out = []
    repaired = _repaired_at(config.repaired_file)
    for alert, samples in found.items():
        finding = FINDINGS_BY_ALERT[alert]
        if finding.renewed_by and repaired is not None:
            since = max(1.0, time.time() - repaired)
            if not _count(api, f"count(last_over_time({finding.renewed_by}{{{own}}}[{duration(since)}]))"):
                out.append(Finding(SOURCE, "warning", "", (
                    f"{finding.words} not counted: repaired {duration(since)} ago, not flagged since "
                    f"({config.repaired_file})"
                )))
                continue
        carrying = _count(api, nodes_carrying(finding, config.breaker_window, matchers=f"cluster={quote(cluster)}"))
        if breaker_tripped(carrying, nodes, config.breaker_percent):
            out.append(Finding(SOURCE, "unknown", "", (
                f"breaker: {finding.words} on {carrying} of {nodes} nodes "
                f"(>{allowed_nodes(nodes, config.breaker_percent)})"
            )))
        else:
            out.append(Finding(SOURCE, "unhealthy", "", _describe(api, finding, samples, own)))
    return out


def _repaired_at(path: str) -> float | None:
    """When the node was last repaired in place: the repaired file's modification time, if there is one."""
    if not path:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _count(api: PrometheusApi, expr: str) -> int:
    samples = api.query(expr)
    return int(samples[0].value) if samples else 0


def _describe(api: PrometheusApi, finding: NodeFinding, samples: list[Sample], own: str) -> str:
    """The finding in a few words, most telling first: the message a node condition shows is 80 characters."""
    if finding.alert == "TrainingNodeRepeatedlySlow":
        counts = []
        for what, record in REPEAT_COUNTS.items():
            value = _count(api, f"{record}{{{own}}}")
            if value:
                counts.append(f"{value} {what.removesuffix('s') if value == 1 else what}")
        return f"{finding.words} ({', '.join(counts)})" if counts else finding.words
    first = min(samples, key=lambda s: (s.labels.get("training_job", ""), _rank(s)))
    job, rank = first.labels.get("training_job", "?"), first.labels.get("rank", "?")
    cause = NODE_CAUSES.get(first.labels.get("cause", ""), "")
    more = len({(s.labels.get("training_job"), s.labels.get("rank")) for s in samples}) - 1
    return f"{finding.words}: rank {rank}{f' +{more}' if more else ''}{f', {cause}' if cause else ''}, job {job}"


def _rank(sample: Sample) -> int:
    try:
        return int(sample.labels.get("rank", ""))
    except ValueError:
        return 1 << 30
