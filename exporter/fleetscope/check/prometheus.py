"""Cross-node findings about this node, from Prometheus: ``fleetscope check``'s ``training`` condition.

Some verdicts only Prometheus can make, because they compare nodes: this node
is a repeat straggler, its ranks are a job's stragglers for a cause on the
node, NcclLateRank names one of its ranks. ``check`` asks Prometheus's HTTP
API (``/api/v1/query``) for the firing alerts of
:data:`fleetscope.check.verdicts.FINDINGS` about its own ``instance``, and
reports them; then, for each one found, how many of the cluster's nodes carry
the same finding (the circuit breaker).

The whole exchange, every question of it, runs under one deadline
(``check.prometheus-timeout``, and never past the check's own): the queries
are asked with httpx on an event loop that cancels them when the deadline
comes, so a server that trickles its answer a byte at a time cannot hold
``check`` longer than a silent one. Whatever goes wrong on the way
(Prometheus unreachable or late, an error answer, something that is no HTTP
or no Prometheus answer, a count that is not a finite number, this node
unknown to it) is "could not tell" about the ``training`` source alone, never
"unhealthy", and never an exception that would take the node's own findings
with it: a broken monitoring path must not mark a node, nor hide what the
node found itself.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import os
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any

import httpx

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
from fleetscope.collectors.protocol import Finding, one_line
from fleetscope.config import CheckConfig, ConfigError, parse_token, read_regular_file

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
    """Instant queries against one Prometheus-compatible HTTP API, through one client (one connection)."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client = client
        self.url = url

    async def query(self, expr: str) -> list[Sample]:
        try:
            async with self.client.stream(
                "POST", f"{self.url}/api/v1/query", data={"query": expr}, headers={"Accept": "application/json"},
            ) as response:
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        raise PrometheusError("answer too large")
        except httpx.HTTPError as exc:
            raise PrometheusError(_failure(exc)) from None
        if response.status_code != 200:
            raise PrometheusError(f"HTTP {response.status_code} {_error_of(bytes(body), response.reason_phrase)}")
        return _vector(bytes(body))


def _failure(exc: httpx.HTTPError) -> str:
    """One line about a request that got no HTTP answer: unreachable, refused TLS, or no HTTP at all."""
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.LocalProtocolError, httpx.DecodingError)):
        return f"did not answer in HTTP: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return "unreachable: timed out"
    reason = str(exc) or type(exc).__name__
    return f"unreachable: {reason}"


def _error_of(body: bytes, reason: str) -> str:
    try:
        return str(json.loads(body[:4096]).get("error", reason))[:120]
    except (ValueError, AttributeError):
        return reason


def _vector(body: bytes) -> list[Sample]:
    try:
        answer: Any = json.loads(body)
        if answer.get("status") != "success":
            raise PrometheusError(f"error answer: {str(answer.get('error'))[:120]}")
        data = answer["data"]
        if data["resultType"] != "vector":
            raise PrometheusError(f"expected a vector, got {str(data['resultType'])[:40]}")
        return [Sample({str(k): str(v) for k, v in item["metric"].items()}, float(item["value"][1]))
                for item in data["result"]]
    except PrometheusError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
        raise PrometheusError("not a Prometheus query answer") from None


# -- how check reaches Prometheus: TLS and credentials --------------------------------------------------


def _secret(path: str, what: str) -> str:
    """A credential read from its file at each round (rotated files are picked up), trimmed."""
    try:
        value = parse_token(read_regular_file(path, what).decode("utf-8"))
    except UnicodeDecodeError:
        raise PrometheusError(f"{what}: {path} is not UTF-8 text") from None
    except ConfigError as exc:
        raise PrometheusError(str(exc)) from None
    if not value:
        raise PrometheusError(f"{what}: {path} is empty")
    return value


def client_settings(config: CheckConfig) -> dict[str, Any]:
    """httpx client arguments for ``config``: the CA to verify Prometheus with, a bearer token or basic auth.

    Never through a proxy from the environment (``trust_env=False``): the query goes where
    ``check.prometheus-url`` says. Amazon Managed Prometheus is asked through a SigV4 proxy on the node
    (docs/deploy.md), which signs the requests; ``check`` itself holds no AWS credentials.
    """
    headers: dict[str, str] = {}
    if config.prometheus_bearer_token_file and config.prometheus_username:
        raise PrometheusError("check.prometheus-bearer-token-file and check.prometheus-username both given: "
                              "give one")
    if config.prometheus_bearer_token_file:
        token = _secret(config.prometheus_bearer_token_file, "check.prometheus-bearer-token-file")
        headers["Authorization"] = f"Bearer {token}"
    elif config.prometheus_username:
        password = ""
        if config.prometheus_password_file:
            password = _secret(config.prometheus_password_file, "check.prometheus-password-file")
        pair = f"{config.prometheus_username}:{password}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    verify: ssl.SSLContext | bool = True
    if config.prometheus_ca_file:
        try:
            verify = ssl.create_default_context(cafile=config.prometheus_ca_file)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise PrometheusError(f"check.prometheus-ca-file: {config.prometheus_ca_file}: {exc}") from None
    return {"headers": headers, "verify": verify, "trust_env": False, "follow_redirects": False}


# -- the exchange ---------------------------------------------------------------------------------------


def own_instance(config: CheckConfig) -> str:
    """The node's ``instance`` label: the setting, else the short host name (the shipped scrape configs)."""
    return config.instance or socket.gethostname().split(".", 1)[0]


def cross_node_findings(config: CheckConfig, deadline: float) -> list[Finding]:
    """The node's eligible cross-node findings: unhealthy, or unknown where the breaker holds them back.

    Every question is asked before ``deadline`` (or ``check.prometheus-timeout`` from now, if sooner), the
    whole exchange included; anything that goes wrong is one "could not tell" finding, never an exception.
    """
    if not config.prometheus_url:
        return [Finding(SOURCE, "unknown", "", "check.prometheus-url is not set")]
    timeout = min(deadline - time.monotonic(), config.prometheus_timeout)
    if timeout <= 0:
        return [Finding(SOURCE, "unknown", "", "Prometheus not asked: no time left")]
    try:
        return asyncio.run(_exchange(config, own_instance(config), timeout))
    except PrometheusError as exc:
        return [Finding(SOURCE, "unknown", "", one_line(f"Prometheus {exc}"))]
    except TimeoutError:
        return [Finding(SOURCE, "unknown", "", f"Prometheus no answer within {round(timeout, 1):g}s")]
    except Exception as exc:  # whatever a broken answer does, the node's own findings must still be reported
        logger.debug("asking Prometheus", exc_info=True)
        return [Finding(SOURCE, "unknown", "", one_line(f"Prometheus {type(exc).__name__}: {exc}"))]


async def _exchange(config: CheckConfig, instance: str, timeout: float) -> list[Finding]:
    # The deadline is the event loop's: httpx's own timeouts bound each read, not the exchange, so they are
    # only a backstop here, a little later.
    async with asyncio.timeout(timeout):
        async with httpx.AsyncClient(timeout=timeout + 1, **client_settings(config)) as client:
            return await _ask(PrometheusApi(client, config.prometheus_url), config, instance)


async def _ask(api: PrometheusApi, config: CheckConfig, instance: str) -> list[Finding]:
    # One question in the common case (no finding): is the node a target Prometheus knows (a wrong
    # check.instance would otherwise read as healthy), and which findings name it.
    answer = await api.query(f"up{{{config.selector}, instance={quote(instance)}}}\nor\n{findings_about(instance)}")
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
    nodes = await _count(api, nodes_scraped(scope, config.breaker_window))
    if nodes == 0:
        return [Finding(SOURCE, "unknown", "", "Prometheus counts no fleetscope nodes to weigh findings against")]
    own = f"instance={quote(instance)}, cluster={quote(cluster)}"
    out = []
    repaired = _repaired_at(config.repaired_file)
    for alert, samples in found.items():
        finding = FINDINGS_BY_ALERT[alert]
        if finding.renewed_by and repaired is not None:
            since = max(1.0, time.time() - repaired)
            if not await _count(api, f"count(last_over_time({finding.renewed_by}{{{own}}}[{duration(since)}]))"):
                out.append(Finding(SOURCE, "warning", "", (
                    f"{finding.words} not counted: repaired {duration(since)} ago, not flagged since "
                    f"({config.repaired_file})"
                )))
                continue
        in_cluster = f"cluster={quote(cluster)}"
        carrying = await _count(api, nodes_carrying(finding, config.breaker_window, matchers=in_cluster))
        if breaker_tripped(carrying, nodes, config.breaker_percent):
            out.append(Finding(SOURCE, "unknown", "", (
                f"breaker: {finding.words} on {carrying} of {nodes} nodes "
                f"(>{allowed_nodes(nodes, config.breaker_percent)})"
            )))
        else:
            out.append(Finding(SOURCE, "unhealthy", "", await _describe(api, finding, samples, own)))
    return out


def _repaired_at(path: str) -> float | None:
    """When the node was last repaired in place: the repaired file's modification time, if there is one."""
    if not path:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


async def _count(api: PrometheusApi, expr: str) -> int:
    samples = await api.query(expr)
    if not samples:
        return 0
    value = samples[0].value
    if not math.isfinite(value) or value < 0:
        raise PrometheusError(f"answered a count of {value}")
    return int(value)


async def _describe(api: PrometheusApi, finding: NodeFinding, samples: list[Sample], own: str) -> str:
    """The finding in a few words, most telling first: the message a node condition shows is 80 characters."""
    if finding.alert == "TrainingNodeRepeatedlySlow":
        counts = []
        for what, record in REPEAT_COUNTS.items():
            value = await _count(api, f"{record}{{{own}}}")
            if value:
                counts.append(f"{value} {what.removesuffix('s') if value == 1 else what}")
        return f"{finding.words} ({', '.join(counts)})" if counts else finding.words
    first = min(samples, key=lambda s: (s.labels.get("training_job", ""), _rank(s)))
    # Label values are anybody's text (a pushed job name): one line, and short, before they reach a verdict.
    job, rank = (one_line(first.labels.get(name, "?"))[:64] for name in ("training_job", "rank"))
    cause = NODE_CAUSES.get(first.labels.get("cause", ""), "")
    more = len({(s.labels.get("training_job"), s.labels.get("rank")) for s in samples}) - 1
    return f"{finding.words}: rank {rank}{f' +{more}' if more else ''}{f', {cause}' if cause else ''}, job {job}"


def _rank(sample: Sample) -> int:
    try:
        return int(sample.labels.get("rank", ""))
    except ValueError:
        return 1 << 30
