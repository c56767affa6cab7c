"""Verdicts that act: the node conditions ``fleetscope check`` reports, and which cross-node findings may mark a node.

A node condition is what Kubernetes tools act on (node-problem-detector sets
it; NVSentinel, a cluster admin's automation or a drain script reads it), a
Slurm drain what Slurm acts on. ``check`` reports three conditions, each from
its own sources:

* ``gpu``: the GPU collector's findings (Xids, lost or missing GPUs, ECC and
  row-remapping faults, NVLink down);
* ``efa``: the EFA collector's (missing devices, ports not ACTIVE, counters
  that cannot be read);
* ``training``: what only Prometheus can tell, because it needs other nodes
  to compare with: the fleetscope alerts of :data:`FINDINGS` about this node.

Only a finding that is the node's fault may mark the node: one that follows
the node from job to job (a repeat straggler), or one whose cause the rules
found on the node itself (an Xid on its GPU, a throttled GPU, EFA or ENA
errors: :data:`NODE_CAUSES`). A slow input pipeline, host-side work of one
rank, or a slowdown no signal explains belongs to the job, and a job-wide or
fleet-wide slowdown to neither node. docs/deploy.md lists them with the
reasons.

The circuit breaker: a finding that more than ``percent`` of the cluster's
nodes carry, within a sliding window, is far likelier a fleet-wide cause (a
network event, a driver rollout, Prometheus itself) than that many bad nodes,
so ``check`` reports it as "could not tell" everywhere and the
``FleetscopeBreakerTripped`` alert says so. Both count with
:func:`nodes_scraped` and :func:`nodes_carrying` from here, and both round the
allowed count up (:func:`allowed_nodes`), so they count the same nodes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from fleetscope.promql import (
    NODE_JOB_STRAGGLERS,
    NODE_SLOWDOWN_CAUSES,
    NODE_STRAGGLER_JOBS,
    NODE_STRAGGLER_WINDOWS,
    indent,
)

# -- node conditions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """One node condition: True while the node has the problem (node-problem-detector's polarity)."""

    name: str  # `fleetscope check --condition <name>`, the verdict file's name
    type: str  # the Kubernetes node condition type
    problem_reason: str  # the condition's reason while True
    healthy_reason: str  # ... while False
    healthy_message: str
    collectors: tuple[str, ...]  # the local collectors whose findings it reports
    cross_node: bool = False  # it reports the Prometheus findings about this node instead


GPU = Condition(
    "gpu", "FleetscopeGPUProblem", "GPUFault", "GPUsHealthy", "fleetscope finds no GPU fault", ("gpu",),
)
EFA = Condition(
    "efa", "FleetscopeEFAProblem", "EFAFault", "EFAHealthy", "fleetscope finds no EFA fault", ("efa",),
)
TRAINING = Condition(
    "training", "FleetscopeTrainingPerformanceProblem", "NodeSlowsTraining", "NoNodeFault",
    "no fleetscope finding blames this node for slow training", (), cross_node=True,
)
CONDITIONS: dict[str, Condition] = {c.name: c for c in (GPU, EFA, TRAINING)}

# -- cross-node findings --------------------------------------------------------------------------------

# Straggler causes (fleetscope.promql.STRAGGLER_CAUSES) found on the node itself, in a few words. The
# others are the job's or nobody's: input_wait (its input pipeline), host_cpu (host-side work of the rank,
# such as rank 0's logging and checkpoints, as often as a slow host), unknown (a code path, a data shard).
NODE_CAUSES: dict[str, str] = {
    "gpu_xid": "Xid on its GPU",
    "gpu_throttled": "GPU throttled",
    "network": "EFA/ENA errors",
}
NODE_CAUSE_MATCHER = 'cause=~"' + "|".join(NODE_CAUSES) + '"'


@dataclass(frozen=True)
class NodeFinding:
    """A fleetscope alert that, when it names this node's ``instance``, is the node's fault."""

    alert: str
    words: str  # what the finding is, in a few words (node condition messages, Slurm drain reasons)
    why: str  # why it is the node's fault (docs)
    matchers: str = ""  # label matchers its alert series must match too
    requires: str = ""  # ...and PromQL they must share labels `on` with
    on: str = ""
    # A finding that rests on history (days of it) outlives an in-place repair; after one
    # (check.repaired-file) it counts again only once this series has a sample about the node.
    renewed_by: str = ""


FINDINGS: tuple[NodeFinding, ...] = (
    NodeFinding(
        "TrainingNodeRepeatedlySlow", "repeat straggler",
        "Its ranks were stragglers in several jobs or separate windows within days: the jobs change, the "
        "node does not.",
        renewed_by=NODE_JOB_STRAGGLERS,
    ),
    NodeFinding(
        "TrainingStragglerRank", "straggler",
        "A rank on it computes slower than its stage, and the cause the rules found is on the node: an Xid or "
        "throttling on the rank's GPU, or EFA/ENA errors on the node.",
        matchers=NODE_CAUSE_MATCHER,
    ),
    NodeFinding(
        "NcclLateRank", "late NCCL rank",
        "A rank on it arrives last at its collectives in every communicator, and the node shows an Xid, GPU "
        "throttling or EFA/ENA errors.",
        requires=NODE_SLOWDOWN_CAUSES, on="instance",
    ),
)
FINDINGS_BY_ALERT: dict[str, NodeFinding] = {f.alert: f for f in FINDINGS}

# What a repeat straggler's message counts (value of each for the instance).
REPEAT_COUNTS = {"jobs": NODE_STRAGGLER_JOBS, "windows": NODE_STRAGGLER_WINDOWS}

# The breaker's defaults, shared by `check` (check.breaker-*) and the rules (FleetscopeBreakerTripped):
# Karpenter and EKS Auto Mode stop repairing above 20% unhealthy nodes of a NodePool; NVSentinel counts the
# distinct nodes it cordoned within a sliding window (5 minutes by default).
BREAKER_PERCENT = 20.0
BREAKER_WINDOW_SECONDS = 600.0


def quote(value: str) -> str:
    """A PromQL string literal (Go's escapes, which JSON's are a subset of)."""
    return json.dumps(value)


def duration(seconds: float) -> str:
    """Whole seconds as a PromQL duration."""
    return f"{max(1, math.ceil(seconds))}s"


def alert_series(finding: NodeFinding, matchers: str = "") -> str:
    """The firing series of the finding's alert (narrowed by ``matchers``), with its own conditions."""
    inner = ", ".join(m for m in (f"alertname={quote(finding.alert)}", 'alertstate="firing"', finding.matchers,
                                   matchers) if m)
    series = f"ALERTS{{{inner}}}"
    if finding.requires:
        return f"{series}\n  and on ({finding.on})\n{finding.requires}"
    return series


def findings_about(instance: str) -> str:
    """Every eligible finding's firing series about one node (the node's own check asks this)."""
    matchers = f"instance={quote(instance)}"
    return "\nor\n".join(f"(\n  {indent(alert_series(f, matchers))}\n)" for f in FINDINGS)


def nodes_carrying(finding: NodeFinding, window: float, by: str = "", matchers: str = "") -> str:
    """Distinct nodes the finding named at any time within ``window`` (a sliding window, as NVSentinel counts)."""
    step = duration(window / 10)
    return (
        f"count{f' by ({by})' if by else ''} (\n"
        f"  group by ({', '.join(p for p in (by, 'instance') if p)}) (\n"
        f"    max_over_time((\n      {indent(alert_series(finding, matchers), '      ')}\n"
        f"    )[{duration(window)}:{step}])\n"
        f"  )\n"
        f")"
    )


def nodes_scraped(selector: str, window: float, by: str = "") -> str:
    """Distinct fleetscope targets scraped (up or down) within ``window``: the nodes the share is of."""
    return (
        f"count{f' by ({by})' if by else ''} (\n"
        f"  group by ({', '.join(p for p in (by, 'instance') if p)}) (\n"
        f"    max_over_time(up{{{selector}}}[{duration(window)}])\n"
        f"  )\n"
        f")"
    )


def allowed_nodes(nodes: int, percent: float) -> int:
    """How many nodes may carry one finding before the breaker trips: the share, rounded up (one at least).

    Rounding up as Karpenter does keeps a single bad node of a small cluster markable.
    """
    return max(1, math.ceil(nodes * percent / 100 - 1e-9))


def breaker_tripped(carrying: int, nodes: int, percent: float) -> bool:
    return carrying > allowed_nodes(nodes, percent)
