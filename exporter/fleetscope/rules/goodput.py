"""Goodput: how much of a job's GPU time turns into progress, and where the rest goes.

Against the job's own best sustained step time (the lowest median step time
it held over ``goodput_sustain_window`` within ``goodput_best_window``), the
goodput ratio is best / current step time, 0 while the job is stalled. The
GPU-seconds lost per second are recorded by cause, each measured from the
phases the ranks report, never modelled: ranks waiting in collectives for a
slower peer (their exposed communication beyond the least-waiting rank's, both as
rates: a checkpoint every peer waits out counts too),
ranks waiting for their own input, every rank of a stalled job, and ranks
gone silent while the others go on. One rank is one GPU.
"""

from __future__ import annotations

from fleetscope import promql
from fleetscope.metrics import training
from fleetscope.promql import (
    GOODPUT_CAUSES,
    JOB_GOODPUT,
    JOB_KEY,
    JOB_LAST_STEP,
    JOB_LOST_GPU_SECONDS,
    JOB_LOST_VS_BEST,
    JOB_RANKS,
    JOB_STALLED,
    JOB_STEP,
    JOB_STEP_BEST,
    JOB_STEP_SUSTAINED,
    RANK_ENDED,
    RANK_KEY,
    indent,
    on_prometheus_clock,
    rank_share,
)
from fleetscope.rules.model import Group, Record, num, sel
from fleetscope.rules.settings import Settings


def stalled(s: Settings) -> str:
    """Jobs whose newest step is older than ``goodput_stall_multiple`` best step times, value = ranks."""
    return (
        f"{JOB_RANKS}\n"
        f"  and on ({JOB_KEY})\n"
        f"(\n"
        f"  time() - {JOB_LAST_STEP}\n"
        f"    > on ({JOB_KEY})\n"
        f"  {num(s.goodput_stall_multiple)} * {JOB_STEP_BEST}\n"
        f")"
    )


def lost(s: Settings) -> dict[str, str]:
    """Per cause of :data:`GOODPUT_CAUSES`, the GPU-seconds a job loses per second."""
    # `>= 0` drops the NaN of a rank without steps in the window (0/0).
    waiting = (
        f"sum by ({JOB_KEY}) (\n"
        f"  ({rank_share('comm')} >= 0)\n"
        f"    - on ({JOB_KEY}) group_left\n"
        f"  min by ({JOB_KEY}) ({rank_share('comm')})\n"
        f")"
    )
    own_input = f"sum by ({JOB_KEY}) ({rank_share('data')} >= 0)"
    silent = promql.silent_ranks(num(s.silent_after_seconds))
    pieces = {
        "straggler_wait": f"{waiting}\n  unless on ({JOB_KEY})\n{JOB_STALLED}",
        "input_wait": f"{own_input}\n  unless on ({JOB_KEY})\n{JOB_STALLED}",
        "hang": JOB_STALLED,
        "silent_ranks": f"count by ({JOB_KEY}) (\n  {indent(silent)}\n)",
    }
    assert list(pieces) == list(GOODPUT_CAUSES)
    return pieces


def recording_rules(s: Settings) -> Group:
    last_step = sel(s, training.LAST_STEP_TIMESTAMP_SECONDS)
    goodput = (
        f"clamp_max({JOB_STEP_BEST} / on ({JOB_KEY}) {JOB_STEP}, 1)\n"
        f"  unless on ({JOB_KEY})\n"
        f"{JOB_STALLED}\n"
        f"or\n"
        f"{JOB_STALLED} * 0"
    )
    rules = [
        # Ranks that said goodbye are left out: a job that ended is not stalled, and loses nothing.
        Record(JOB_RANKS, f"count by ({JOB_KEY}) (\n  {last_step}\n    unless on ({RANK_KEY})\n  {RANK_ENDED}\n)"),
        # On Prometheus's clock, as time() it is compared with (a node's wall clock may be stepped).
        Record(JOB_LAST_STEP, f"max by ({JOB_KEY}) (\n  {indent(on_prometheus_clock(last_step))}\n)"),
        Record(JOB_STEP_SUSTAINED, f"quantile_over_time(0.5, {JOB_STEP}[{s.goodput_sustain_window}])"),
        Record(JOB_STEP_BEST, f"min_over_time({JOB_STEP_SUSTAINED}[{s.goodput_best_window}])"),
        Record(JOB_STALLED, stalled(s)),
        Record(JOB_GOODPUT, goodput),
        Record(JOB_LOST_VS_BEST, f"{JOB_RANKS}\n  * on ({JOB_KEY})\n(1 - {JOB_GOODPUT})"),
    ]
    # One rule per cause, each labelled with it: four short expressions, not one union of four.
    rules += [Record(JOB_LOST_GPU_SECONDS, expr, {"cause": cause}) for cause, expr in lost(s).items()]
    return Group("fleetscope-goodput.rules", tuple(rules), interval=s.slow_evaluation_interval)
