"""NCCL Inspector rules: the rank that arrives last at its collectives, and bus-bandwidth collapse.

In a synchronous collective no rank can finish before the last one has
arrived, so the execution time the Inspector logs is the transfer plus the
wait for the last rank: the rank that arrives last waits least and has the
shortest time; its peers have the longest. So a straggler is the rank whose
collective time is persistently *below* its communicator's median for the
same collectives (collective kind and size bucket), and the gap, times how
often they run, is the share of their time its peers spend waiting for it.

A rank held up by a late peer in one group (a tensor-parallel sibling of a
slow GPU) arrives late in its other groups too, but not in the group with
the slow GPU, where it waits: a rank is named only when it is late in every
communicator it reports.

Bus bandwidth is read from the best rank of each communicator (the last to
arrive, whose time has no wait in it), compared with its own average an
offset earlier. One ring or tree moves at its slowest link, so a slow link
slows every rank of a communicator alike: a collapse confined to one node's
communicators (its NVLink group, the pairs it is in) is that node's; one on
most of a job's nodes is job-wide, and the alert lists the nodes whose EFA
counters show trouble.
"""

from __future__ import annotations

from fleetscope import promql
from fleetscope.metrics import nccl
from fleetscope.promql import (
    NCCL_COLLECTIVE_MEAN,
    NCCL_COMM_BUS_BANDWIDTH,
    NCCL_COMM_BUS_BANDWIDTH_BASELINE,
    NCCL_COMM_COLLECTIVE_MEDIAN,
    NCCL_NODE_BUS_BANDWIDTH_BASELINE,
    NCCL_RANK_COMM_RATIO,
    NCCL_RANK_COMM_WAIT,
    NCCL_RANK_RATIO,
    NCCL_RANK_WAIT,
    RANK_COMPUTE_RATIO_SMOOTHED,
    RANK_KEY,
    STRAGGLERS,
    indent,
)
from fleetscope.rules.model import Alert, Group, Record, num, sel
from fleetscope.rules.settings import Settings

# Every aggregation keeps `cluster`: shards of one workspace read only their own records (docs/deploy.md).
COLLECTIVE_KEY = "cluster, comm, collective, size_bucket"
RANK_COMM_KEY = "cluster, instance, training_job, rank, comm, comm_rank"
NETWORK_CAUSES = "network"


def _rate(s: Settings, metric: object) -> str:
    return f"rate({sel(s, str(metric))}[{s.rate_window}])"


def _expected_seconds(s: Settings) -> str:
    """Per rank and communicator: seconds per second the median rank spends on this rank's collectives."""
    return (
        f"sum by ({RANK_COMM_KEY}) (\n"
        f"  {_rate(s, nccl.COLLECTIVES_TOTAL)}\n"
        f"    * on ({COLLECTIVE_KEY}) group_left\n"
        f"  {NCCL_COMM_COLLECTIVE_MEDIAN}\n"
        f")"
    )


def _own_seconds(s: Settings) -> str:
    """Per rank and communicator: seconds per second this rank spends in the same collectives."""
    return (
        f"sum by ({RANK_COMM_KEY}) (\n"
        f"  {_rate(s, nccl.COLLECTIVE_SECONDS_TOTAL)}\n"
        f"    and on ({COLLECTIVE_KEY})\n"
        f"  {NCCL_COMM_COLLECTIVE_MEDIAN}\n"
        f")"
    )


def recording_rules(s: Settings) -> Group:
    count_rate = _rate(s, nccl.COLLECTIVES_TOTAL)
    seconds_rate = _rate(s, nccl.COLLECTIVE_SECONDS_TOTAL)
    own, expected = _own_seconds(s), _expected_seconds(s)
    delivered = (
        f"max by (training_job, {COLLECTIVE_KEY}) (\n"
        f"  {_rate(s, nccl.COLLECTIVE_BUS_BYTES_TOTAL)}\n"
        f"    /\n"
        f"  ({seconds_rate} > 0)\n"
        f")"
    )
    window, offset = s.nccl_bandwidth_window, s.nccl_bandwidth_baseline_offset
    present = f"count by (instance, training_job, {COLLECTIVE_KEY}) ({count_rate} > 0)"
    rules = (
        Record(NCCL_COLLECTIVE_MEAN, f"{seconds_rate}\n  /\n({count_rate} > 0)"),
        Record(NCCL_COMM_COLLECTIVE_MEDIAN, (
            f"quantile by ({COLLECTIVE_KEY}) (0.5, {NCCL_COLLECTIVE_MEAN})\n"
            f"  and on ({COLLECTIVE_KEY})\n"
            f"count by ({COLLECTIVE_KEY}) ({NCCL_COLLECTIVE_MEAN}) > 1"
        )),
        Record(NCCL_RANK_COMM_RATIO, f"{own}\n  /\n({expected} > 0)"),
        Record(NCCL_RANK_COMM_WAIT, f"{expected}\n  -\n{own}"),
        Record(NCCL_RANK_RATIO, f"max by (cluster, {RANK_KEY}) ({NCCL_RANK_COMM_RATIO})"),
        Record(NCCL_RANK_WAIT, f"max by (cluster, {RANK_KEY}) ({NCCL_RANK_COMM_WAIT})"),
        Record(NCCL_COMM_BUS_BANDWIDTH, delivered),
        Record(NCCL_COMM_BUS_BANDWIDTH_BASELINE, (
            f"avg_over_time({NCCL_COMM_BUS_BANDWIDTH}[{window}])\n"
            f"  /\n"
            f"avg_over_time({NCCL_COMM_BUS_BANDWIDTH}[{window}] offset {offset})"
        )),
        Record(NCCL_NODE_BUS_BANDWIDTH_BASELINE, (
            f"min by (cluster, instance, training_job) (\n"
            f"  {NCCL_COMM_BUS_BANDWIDTH_BASELINE}\n"
            f"    * on (training_job, {COLLECTIVE_KEY}) group_right ()\n"
            f"  ({indent(present)} * 0 + 1)\n"
            f")"
        )),
    )
    return Group("fleetscope-nccl.rules", rules)


def _step_time_verdict() -> str:
    """Template: what the step-time straggler rule says about the same rank, when the job pushes step timings."""
    this_rank = f'{RANK_COMPUTE_RATIO_SMOOTHED}{{training_job="%s",rank="%s"}}'
    flagged = f'{STRAGGLERS}{{training_job="%s",rank="%s"}}'
    other_ranks = f'{STRAGGLERS}{{training_job="%s",rank!="%s"}}'
    any_rank = f'{RANK_COMPUTE_RATIO_SMOOTHED}{{training_job="%s"}}'
    return (
        f"{{{{ with printf `{this_rank}` $labels.training_job $labels.rank | query }}}}"
        "{{ with index . 0 }} Step timings: its compute time is {{ printf \"%.2f\" .Value }}x its stage median"
        f"{{{{ end }}}}{{{{ with printf `{flagged}` $labels.training_job $labels.rank | query }}}}, so the "
        "step-time straggler rule agrees.{{ else }}, not slower than its peers: the delay comes before or after "
        "its timed compute (input, host CPU, a synchronisation in the training loop).{{ end }}"
        f"{{{{ with printf `{other_ranks}` $labels.training_job $labels.rank | query }}}} Step timings name rank"
        "{{ range $i, $r := . }}{{ if $i }},{{ end }} {{ $r.Labels.rank }}{{ end }} as slow.{{ end }}"
        f"{{{{ else }}}}{{{{ with printf `{any_rank}` $labels.training_job | query }}}}{{{{ else }}}} This job "
        "pushes no step timings: the Inspector is the only evidence.{{ end }}{{ end }}"
    )


def _network_nodes(job_matcher: str) -> str:
    """Template listing the job's nodes whose EFA counters name a cause."""
    query = (
        f'{promql.NODE_SLOWDOWN_CAUSES}{{cause=~"{NETWORK_CAUSES}"}} '
        f'and on (instance) {NCCL_NODE_BUS_BANDWIDTH_BASELINE}{{{job_matcher}}}'
    )
    return (
        f"{{{{ with printf `{query}` $labels.training_job | query }}}} Nodes with network trouble:"
        "{{ range $i, $c := . }}{{ if $i }},{{ end }} {{ $c.Labels.instance }} ({{ $c.Labels.cause }}){{ end }}. "
        "A ring or tree moves at its slowest link, so one node's network slows every rank: start there."
        "{{ else }} No node of the job shows EFA drops, errors or retransmits: suspect fabric congestion or "
        "a change in the job (message sizes, NCCL algorithm or settings).{{ end }}"
    )


def alert_rules(s: Settings) -> Group:
    late = (
        f"{NCCL_RANK_RATIO} < {num(s.nccl_late_ratio)}\n"
        f"and on ({RANK_KEY})\n"
        f"{NCCL_RANK_WAIT} > {num(s.nccl_late_wait_share)}"
    )
    wait = (
        f"{{{{ with printf `{NCCL_RANK_WAIT}{{instance=\"%s\",training_job=\"%s\",rank=\"%s\"}}` "
        "$labels.instance $labels.training_job $labels.rank | query }}"
        "{{ with index . 0 }} Its peers' collectives spend {{ .Value | humanizePercentage }} of the time waiting "
        "for it.{{ end }}{{ end }}"
    )
    rank = "Rank {{ $labels.rank }} of training job {{ $labels.training_job }} on {{ $labels.instance }}"
    arrives = (
        f"{rank} arrives last at its collectives in every communicator it is in: its collective time is "
        "{{ printf \"%.2f\" $value }}x what the median rank spends on the same collectives "
        f"(threshold {num(s.nccl_late_ratio)})."
    )
    bw_ratio = num(s.nccl_bandwidth_ratio)
    collapsed = f"{NCCL_NODE_BUS_BANDWIDTH_BASELINE} < {bw_ratio}"
    collapsed_share = (
        f"count by (cluster, training_job) ({collapsed})\n"
        f"  /\n"
        f"count by (cluster, training_job) ({NCCL_NODE_BUS_BANDWIDTH_BASELINE})"
    )
    alerts = (
        Alert(
            "NcclLateRank", late, "warning",
            "One rank arrives last at its NCCL collectives and the others wait for it (NCCL Inspector).",
            arrives + wait + _step_time_verdict(),
            s.nccl_late_for,
        ),
        Alert(
            "NcclLateRank",
            f"(\n  {indent(late)}\n)\nand on ({RANK_KEY})\n{STRAGGLERS}",
            "critical",
            "One rank arrives last at its NCCL collectives and its step timings confirm it computes slower.",
            arrives + wait + _step_time_verdict(),
            s.nccl_late_for,
        ),
        Alert(
            "NcclNodeBusBandwidthCollapse",
            f"{collapsed}\nand on (training_job)\n(\n  {indent(collapsed_share)}\n) <= 0.5",
            "warning",
            "NCCL bus bandwidth collapsed in the communicators of one node of a job, not on the others.",
            "On {{ $labels.instance }} the bus bandwidth of training job {{ $labels.training_job }}'s collectives "
            f"fell to {{{{ $value | humanizePercentage }}}} of its average {s.nccl_bandwidth_baseline_offset} "
            f"earlier (threshold {num(s.nccl_bandwidth_ratio * 100)}%), while most of the job's nodes kept theirs: "
            "the links of this node (NVLink or PCIe inside it, or its network) are slow. "
            "{{ with printf `" + promql.NODE_SLOWDOWN_CAUSES + "{instance=\"%s\"}` $labels.instance | query }}"
            "Signals on the node:{{ range $i, $c := . }}{{ if $i }},{{ end }} {{ $c.Labels.cause }}{{ end }}."
            "{{ else }}No GPU or EFA signal on the node names a cause.{{ end }}",
            s.nccl_bandwidth_for,
        ),
        Alert(
            "NcclJobBusBandwidthCollapse",
            f"(\n  {indent(collapsed_share)}\n) > 0.5",
            "warning",
            "NCCL bus bandwidth collapsed across most nodes of a job.",
            "On {{ $value | humanizePercentage }} of training job {{ $labels.training_job }}'s nodes the bus "
            f"bandwidth of its collectives fell below {num(s.nccl_bandwidth_ratio * 100)}% of its average "
            f"{s.nccl_bandwidth_baseline_offset} earlier."
            + _network_nodes('training_job="%s"'),
            s.nccl_bandwidth_for,
        ),
    )
    return Group("fleetscope-nccl", alerts)
