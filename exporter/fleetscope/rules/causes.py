"""The straggler cause verdict: one recording rule that alerts and dashboards both read.

First the evidence on each node and GPU (an Xid, throttling or a low clock,
network trouble), then, for every flagged rank, the first cause that fits, in
the order of :data:`fleetscope.promql.STRAGGLER_CAUSES`: signals of the
rank's own GPU and input pipeline come before trouble its whole node shares,
and "unknown" is said out loud rather than guessed.
"""

from __future__ import annotations

from fleetscope.metrics import efa, gpu
from fleetscope.promql import (
    ENA_ALLOWANCE_SHAPED,
    GPU_BUSY,
    GPU_CLOCK_RATIO,
    GPU_THROTTLE_SHARE,
    JOB_KEY,
    JOB_STRAGGLER_CAUSES,
    NODE_SLOWDOWN_CAUSES,
    RANK_GPU,
    RANK_GPU_BUSY,
    RANK_KEY,
    SLOWDOWN_REASONS,
    STRAGGLER_CAUSE,
    STRAGGLER_CAUSES,
    STRAGGLERS,
    efa_rate,
    indent,
    rank_share,
)
from fleetscope.rules.model import Group, Record, new_or_increased, num, sel
from fleetscope.rules.settings import Settings
from fleetscope.rules.training import flag_records

EFA_ERROR_EVENTS = (
    efa.RETRANSMIT_TIMEOUT_EVENTS_TOTAL,
    efa.UNRESPONSIVE_REMOTE_EVENTS_TOTAL,
    efa.IMPAIRED_REMOTE_CONNECTION_EVENTS_TOTAL,
)


def present(expr: str) -> str:
    """1 for every series of ``expr`` (a filter), keeping its labels."""
    return f"(\n  {indent(expr)}\n) * 0 + 1"


def evidence(s: Settings) -> dict[str, str]:
    """Per cause: per GPU (gpu_xid, gpu_throttled) and per node (network) evidence, value 1."""
    xid = sel(s, gpu.XID_ERRORS_TOTAL)
    cw = s.cause_xid_window
    xid_recent = f"max by (cluster, instance, gpu) (\n  {indent(new_or_increased(s, xid, cw))}\n)"
    throttled = (
        f"max by (cluster, instance, gpu) ({GPU_THROTTLE_SHARE}{{reason=~\"{SLOWDOWN_REASONS}\"}})"
        f" > {num(s.cause_throttle_share)}\n"
        f"or\n"
        f"max by (cluster, instance, gpu) ({GPU_CLOCK_RATIO}) < {num(s.cause_clock_ratio)}\n"
        f"  and on (instance, gpu)\n"
        f"max by (cluster, instance, gpu) ({GPU_BUSY}) > {num(s.clock_busy_ratio)}"
    )
    w = s.share_window
    network_signals = [
        f"{efa_rate('retransmit_packets')} > {num(s.efa_retransmit_cause_per_second)}",
        f"{efa_rate('rx_drops')} > {num(s.efa_rx_drops_per_second)}",
        *(f"increase({sel(s, counter)}[{w}]) > 0" for counter in EFA_ERROR_EVENTS),
        f"{ENA_ALLOWANCE_SHAPED} > {num(s.ena_allowance_per_second)}",
    ]
    network = "max by (cluster, instance) (\n  " + "\n  or\n  ".join(network_signals) + "\n)"
    return {cause: present(expr) for cause, expr in
            (("gpu_xid", xid_recent), ("gpu_throttled", throttled), ("network", network))}


def verdict(s: Settings) -> dict[str, str]:
    """Per cause of :data:`STRAGGLER_CAUSES`: the flagged ranks it fits and no cause before it does. Each is one
    rule of the group, in that order: a rule reads the verdicts the rules before it wrote at this evaluation."""
    host = (
        f"{RANK_GPU_BUSY}\n"
        f"  < on ({JOB_KEY}) group_left\n"
        f"{num(s.cause_gpu_busy_ratio)} * quantile by ({JOB_KEY}) (0.5, {RANK_GPU_BUSY})"
    )
    conditions = {
        "gpu_xid": f"and on (instance, gpu)\n{NODE_SLOWDOWN_CAUSES}{{cause=\"gpu_xid\"}}",
        "gpu_throttled": f"and on (instance, gpu)\n{NODE_SLOWDOWN_CAUSES}{{cause=\"gpu_throttled\"}}",
        "input_wait": f"and on ({RANK_KEY})\n{rank_share('data')} > {num(s.input_warning_share)}",
        "network": f"and on (instance)\n{NODE_SLOWDOWN_CAUSES}{{cause=\"network\"}}",
        "host_cpu": f"and on ({RANK_KEY})\n(\n  {indent(host)}\n)",
        "unknown": "",
    }
    assert list(conditions) == list(STRAGGLER_CAUSES), "the verdict tests the causes in the vocabulary's order"
    out: dict[str, str] = {}
    for cause, condition in conditions.items():
        expr = f"{STRAGGLERS}\n  {condition}" if condition else STRAGGLERS
        if out:
            expr += f"\n  unless on ({RANK_KEY})\n{STRAGGLER_CAUSE}{{cause=~\"{'|'.join(out)}\"}}"
        out[cause] = expr
    return out


def recording_rules(s: Settings) -> Group:
    """The flags, then the evidence and the verdict that read them at the same evaluation."""
    rank_busy = f"{RANK_GPU}\n  * on (instance, gpu) group_left ()\n{GPU_BUSY}"
    return Group("fleetscope-stragglers.rules", (
        *flag_records(s),
        *(Record(NODE_SLOWDOWN_CAUSES, expr, {"cause": cause}) for cause, expr in evidence(s).items()),
        Record(RANK_GPU_BUSY, rank_busy),
        *(Record(STRAGGLER_CAUSE, expr, {"cause": cause}) for cause, expr in verdict(s).items()),
        Record(JOB_STRAGGLER_CAUSES, f"count by ({JOB_KEY}, cause) ({STRAGGLER_CAUSE})"),
    ), interval=s.training_evaluation_interval)
