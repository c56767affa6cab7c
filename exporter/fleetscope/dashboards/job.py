"""Training job: why is this job slow, which rank holds it back, is it hung."""

from __future__ import annotations

from typing import Any

from fleetscope.dashboards import exprs
from fleetscope.dashboards.kit import (
    UID_JOB,
    Q,
    alerts_annotation,
    bargauge_panel,
    build_dashboard,
    cluster_variable,
    falling,
    heatmap_panel,
    link,
    mappings,
    node_url,
    ok,
    query_variable,
    rising,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from fleetscope.dashboards.nccl_panels import nccl_row
from fleetscope.metrics import gpu, training
from fleetscope.promql import (
    JOB_COMM_SHARE,
    JOB_DATA_SHARE,
    JOB_GOODPUT,
    JOB_LOST_GPU_SECONDS,
    JOB_LOST_VS_BEST,
    JOB_MIN_COMM_SHARE,
    JOB_STEP,
    JOB_STEP_BEST,
    JOB_STRAGGLER_CAUSES,
    JOB_STRAGGLER_THRESHOLD,
    JOB_TOKEN_RATE,
    RANK_COMM_SHARE,
    RANK_COMPUTE_RATIO_SMOOTHED,
    RANK_DATA_SHARE,
    RANK_GPU_BUSY,
    STRAGGLER_CAUSE,
)
from fleetscope.rules.settings import PRODUCTION

J = 'cluster=~"$cluster", training_job=~"$training_job"'
RATE = "[$__rate_interval]"


def _on_job_gpus(gpu_metric: str) -> str:
    """A per-GPU metric for the GPUs this job's ranks run on, labelled by rank."""
    return (
        f"max by (rank) ({gpu_metric} * on (instance, gpu) group_left (rank) "
        f"{training.RANK_INFO}{{{J}}})"
    )


def build() -> Any:
    warn, crit = exprs.STRAGGLER_WARN, exprs.STRAGGLER_CRIT
    variables = [
        cluster_variable(),
        query_variable("training_job", "Training job",
                       f'label_values({training.STEPS_TOTAL}{{cluster=~"$cluster"}}, training_job)',
                       multi=False, include_all=False),
    ]
    summary = [
        stat_panel("Ranks reporting", "none", ok("blue"), Q(f"count({training.LAST_STEP}{{{J}}})")),
        stat_panel("Step time (median rank)", "s", ok("blue"), Q(f"max({JOB_STEP}{{{J}}})"),
                   description="Median over ranks of each rank's rolling-median step time."),
        stat_panel("Tokens per second", "short", ok("blue"), Q(f"sum({JOB_TOKEN_RATE}{{{J}}})")),
        stat_panel("Since last progress", "s", rising(120, 600),
                   Q(f"time() - max{exprs.last_step_stamp(J)}"),
                   description="Seconds since the newest step of any rank. Minutes without progress: a hang."),
        stat_panel("Goodput", "percentunit", falling(0.8, 0.95), Q(f"min({JOB_GOODPUT}{{{J}}})"),
                   description="The job's best sustained step time over its current one: the share of its GPU time "
                               "that turns into progress at its own best pace (0 while it makes no steps)."),
        stat_panel("Slowest rank vs stage median", "percentunit", rising(warn, crit),
                   Q(f"max({RANK_COMPUTE_RATIO_SMOOTHED}{{{J}}})"),
                   description="The largest smoothed compute ratio, the statistic the straggler rule judges. "
                               "The rule's threshold for this job is in the Stragglers row."),
    ]
    speed = [
        timeseries_panel("Step time", "s", ok(),
                         Q(exprs.mean_step_seconds(J, "training_job", "$__rate_interval"), "mean over ranks"),
                         Q(f"max({JOB_STEP}{{{J}}})", "median rank (rolling)"),
                         Q(f"max({training.STEP_SECONDS_MEDIAN}{{{J}}})", "slowest rank (rolling)"),
                         Q(f"max({JOB_STEP_BEST}{{{J}}})", "best sustained"), width=8),
        timeseries_panel("Throughput", "short", ok(),
                         Q(f"sum({JOB_TOKEN_RATE}{{{J}}})", "tokens/s"),
                         Q(f"sum(rate({training.SAMPLES_TOTAL}{{{J}}}{RATE}))", "samples/s"), width=8),
        timeseries_panel("Step time breakdown", "percentunit",
                         rising(PRODUCTION.input_warning_share, PRODUCTION.comm_share),
                         Q(f"max({JOB_DATA_SHARE}{{{J}}})", "data wait (median rank)"),
                         Q(f"max({JOB_COMM_SHARE}{{{J}}})", "exposed communication (median rank)"),
                         Q(f"max({JOB_MIN_COMM_SHARE}{{{J}}})", "exposed communication (least-waiting rank)"),
                         width=8, minimum=0,
                         description="Share of step time per phase. Communication the least-waiting rank pays is the "
                                     "collectives' own cost (communication-bound above 25%); what the median rank "
                                     "waits beyond it is waiting for a slower peer."),
    ]
    stragglers = [
        heatmap_panel("Compute time relative to stage median, per rank", "percentunit", rising(warn, crit),
                      Q(f"max by (rank) ({RANK_COMPUTE_RATIO_SMOOTHED}{{{J}}})", "{{rank}}"), low=0.9, high=1.2,
                      description="One row per rank: its rolling-median compute time over its pipeline stage's median, "
                                  "smoothed as the straggler rule sees it. A persistently red row is a straggler."),
        table_panel("Flagged ranks and their cause", "percentunit", rising(warn, crit),
                    Q(f"{STRAGGLER_CAUSE}{{{J}}}", table=True), width=16,
                    links=[link("Node detail", node_url("${__data.fields.instance}"))],
                    sort_by="Compute vs stage median",
                    rename={"Value": "Compute vs stage median", "cause": "Cause"},
                    column_units={"Cause": "none"}, value_mappings={"Cause": mappings(exprs.cause_mappings())},
                    description="Every rank the straggler rule flags, with node, GPU and the cause verdict: the same "
                                "recording rule the TrainingStragglerRank alert reads."),
        stat_panel("Straggler threshold", "percentunit", ok("blue"), Q(f"max({JOB_STRAGGLER_THRESHOLD}{{{J}}})"),
                   width=4, height=8,
                   description="The smoothed ratio above which a rank of this job is flagged: 1 + the larger of "
                               f"{PRODUCTION.straggler_min_excess:.0%} and the job's own spread between ranks."),
        bargauge_panel("Flagged ranks by cause", "none", rising(1, 1),
                       Q(f"sum by (cause) ({JOB_STRAGGLER_CAUSES}{{{J}}})", "{{cause}}", instant=True), width=4),
        timeseries_panel("Data wait per rank", "percentunit",
                         rising(PRODUCTION.input_warning_share, PRODUCTION.input_critical_share),
                         Q(f"topk(10, max by (rank) ({RANK_DATA_SHARE}{{{J}}}))", "rank {{rank}}"),
                         description="The ten ranks waiting longest for input, as a share of their step time."),
        timeseries_panel("Exposed communication per rank", "percentunit", rising(PRODUCTION.comm_share, 0.5),
                         Q(f"topk(10, max by (rank) ({RANK_COMM_SHARE}{{{J}}}))", "rank {{rank}}"),
                         description="Ranks that wait most in collectives; the straggler is usually the one that "
                                     "waits least."),
    ]
    goodput = [
        timeseries_panel("GPU-seconds lost per second, by cause", "none", ok(),
                         Q(f"sum by (cause) ({JOB_LOST_GPU_SECONDS}{{{J}}})", "{{cause}}"),
                         Q(f"sum({JOB_LOST_VS_BEST}{{{J}}})", "all, against the best sustained step"),
                         width=12, minimum=0,
                         description="GPUs' worth of time lost: ranks waiting for a slower peer, for their own input, "
                                     "ranks of a stalled job, silent ranks; the line is the whole loss against the "
                                     "job's best sustained step time (whatever no wait explains: all ranks slower)."),
        bargauge_panel("GPU-hours lost in the time range, by cause", "none", rising(1, 10),
                       Q(f"sum by (cause) (avg_over_time({JOB_LOST_GPU_SECONDS}{{{J}}}[$__range])) * $__range_s / 3600",
                         "{{cause}}", instant=True), width=12,
                       description="The same causes summed over the dashboard's time range."),
    ]
    hang = [
        timeseries_panel("Progress per rank (last step)", "none", ok(),
                         Q(f"max by (rank) ({training.LAST_STEP}{{{J}}})", "rank {{rank}}"), width=12,
                         description="A rank whose line goes flat while others climb, or all flat at once: a hang."),
        bargauge_panel("Seconds since each rank's last step (worst 20)", "s", rising(120, 600),
                       Q(f"topk(20, max by (rank, instance) (time() - {exprs.last_step_stamp(J)}))",
                         "rank {{rank}} on {{instance}}", instant=True), width=12,
                       links=[link("Node detail", node_url("${__field.labels.instance}"))]),
    ]
    gpus = [
        timeseries_panel("GPU activity of the job's GPUs", "percentunit", falling(0.5, 0.8),
                         Q(f"max by (rank) ({RANK_GPU_BUSY}{{{J}}})", "rank {{rank}}"), width=8,
                         minimum=0, maximum=1,
                         description="SM activity where the GPU reports it, else utilization. A straggler whose GPU "
                                     "is less busy than its peers' is fed too slowly by its host (cause host_cpu)."),
        timeseries_panel("GPU power of the job's GPUs", "watt", rising(600, 700),
                         Q(_on_job_gpus(str(gpu.POWER_WATTS)), "rank {{rank}}"), width=8),
        timeseries_panel("GPU temperature of the job's GPUs", "celsius", rising(80, 87),
                         Q(_on_job_gpus(str(gpu.TEMPERATURE_CELSIUS)), "rank {{rank}}"), width=8),
    ]
    return build_dashboard(
        UID_JOB, "fleetscope / Training job",
        "One training job: step time, throughput, goodput and GPU time lost by cause, per-rank compute relative to "
        "the stage median, flagged stragglers with their cause, time breakdown and per-rank progress for hangs.",
        variables,
        [("Summary", summary), ("Speed", speed), ("Stragglers", stragglers), ("Lost GPU time", goodput),
         ("Hang diagnosis", hang), ("GPUs of this job", gpus), ("NCCL collectives (Inspector)", nccl_row(J, RATE))],
        annotations=[alerts_annotation(J)],
    )
