"""PromQL shared by several dashboards (the training-job views of fleet and job).

Functions take a label-matcher string (``cluster=~"$cluster"``) and return
PromQL text; nothing here depends on the Grafana SDK.
"""

from __future__ import annotations

from fleetscope import signals

# One row of a straggler table: a rank on a node.
RANK_LABELS = "cluster, training_job, pp_stage, rank, instance"

# Clock-event reasons that mean the GPU slowed itself down (idle and application clocks are not slowdowns).
SLOWDOWN_REASONS = "hw_slowdown|hw_thermal|hw_power_brake|sw_thermal|sw_power_cap"

# Likely-cause codes of the straggler tables, checked in this order (first match wins): signals of the
# rank's own GPU and input pipeline come before node-wide EFA trouble, which every rank of the node shares.
CAUSES: dict[int, tuple[str, str]] = {
    0: ("no node signal: compare code path / data shard", "text"),
    1: ("GPU Xid errors (last hour)", "red"),
    2: ("GPU clocks throttled", "orange"),
    3: ("input pipeline (data wait > 5% of step)", "yellow"),
    4: ("EFA retransmits on node", "orange"),
}


def relative_compute(matchers: str) -> str:
    """Each rank's rolling-median compute time over its pipeline stage's median (1.0 = typical).

    Compute time, not step time: in synchronous training a slow rank's delay
    shows up as communication wait on every other rank, so step times match.
    """
    median = f"fleetscope_training_compute_seconds_median{{{matchers}}}"
    return (
        f"{median} / on (cluster, training_job, pp_stage) group_left () "
        f"quantile by (cluster, training_job, pp_stage) (0.5, {median})"
    )


def with_gpu(expr: str, matchers: str) -> str:
    """Add the rank's ``gpu`` label (from rank_info) to a per-rank series."""
    return signals.with_gpu(expr, f"fleetscope_training_rank_info{{{matchers}}}")


def _per_rank_from_gpu(gpu_expr: str, matchers: str) -> str:
    """A per-(instance, gpu) signal, carried over to the ranks running on those GPUs."""
    return (
        f"max by ({RANK_LABELS}) (fleetscope_training_rank_info{{{matchers}}} "
        f"* on (instance, gpu) group_left () ({gpu_expr}))"
    )


def likely_cause(matchers: str) -> str:
    """A code from :data:`CAUSES` for every rank: the first node-side signal that explains slowness.

    Input-bound uses the PyTorch profiler's rule (DataLoader time above 5% of the step).
    """
    xid = _per_rank_from_gpu("max by (instance, gpu) (increase(fleetscope_gpu_xid_errors_total[1h]))", matchers)
    throttle = _per_rank_from_gpu(
        f'max by (instance, gpu) (rate(fleetscope_gpu_throttle_seconds_total{{reason=~"{SLOWDOWN_REASONS}"}}[5m]))',
        matchers,
    )
    efa = (
        f"max by ({RANK_LABELS}) (fleetscope_training_rank_info{{{matchers}}} * on (instance) group_left () "
        f"(sum by (instance) (rate(fleetscope_efa_retransmit_packets_total[5m]))))"
    )
    data = (
        f"max by ({RANK_LABELS}) (rate(fleetscope_training_data_seconds_total{{{matchers}}}[5m]) "
        f"/ rate(fleetscope_training_step_seconds_total{{{matchers}}}[5m]))"
    )
    every_rank = f"max by ({RANK_LABELS}) ({relative_compute(matchers)})"
    return (
        f"(({xid}) > 0) * 0 + 1 or (({throttle}) > 0.05) * 0 + 2 or (({data}) > 0.05) * 0 + 3 "
        f"or (({efa}) > 1) * 0 + 4 or ({every_rank}) * 0"
    )


def worst_ranks(matchers: str, count: int = 20) -> str:
    """The ``count`` ranks with the highest relative compute time, with their GPU."""
    return f"topk({count}, {with_gpu(f'max by ({RANK_LABELS}) ({relative_compute(matchers)})', matchers)})"


def cause_of_worst_ranks(matchers: str, count: int = 20) -> str:
    """:func:`likely_cause` for the same ranks as :func:`worst_ranks` (same labels, so tables merge)."""
    return (
        f"{with_gpu(likely_cause(matchers), matchers)} "
        f"and on (training_job, rank, instance) {worst_ranks(matchers, count)}"
    )


def mean_step_seconds(matchers: str, by: str, window: str = "5m") -> str:
    """Mean step time over ranks: step seconds per step, both summed over the group."""
    return (
        f"sum by ({by}) (rate(fleetscope_training_step_seconds_total{{{matchers}}}[{window}])) "
        f"/ sum by ({by}) (rate(fleetscope_training_steps_total{{{matchers}}}[{window}]))"
    )
