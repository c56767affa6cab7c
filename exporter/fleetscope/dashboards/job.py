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

J = 'cluster=~"$cluster", training_job=~"$training_job"'
RATE = "[$__rate_interval]"


def _share(part: str) -> str:
    """Job-wide share of step time spent in ``part`` (data, compute, comm)."""
    return (
        f"sum(rate(fleetscope_training_{part}_seconds_total{{{J}}}{RATE})) "
        f"/ sum(rate(fleetscope_training_step_seconds_total{{{J}}}{RATE}))"
    )


def _on_job_gpus(gpu_metric: str) -> str:
    """A per-GPU metric for the GPUs this job's ranks run on, labelled by rank."""
    return (
        f"max by (rank) ({gpu_metric} * on (instance, gpu) group_left (rank) "
        f"fleetscope_training_rank_info{{{J}}})"
    )


def build() -> Any:
    variables = [
        cluster_variable(),
        query_variable("training_job", "Training job",
                       'label_values(fleetscope_training_steps_total{cluster=~"$cluster"}, training_job)',
                       multi=False, include_all=False),
    ]
    summary = [
        stat_panel("Ranks reporting", "none", ok("blue"), Q(f"count(fleetscope_training_last_step{{{J}}})")),
        stat_panel("Step time (median rank)", "s", ok("blue"),
                   Q(f"quantile(0.5, fleetscope_training_step_seconds_median{{{J}}})"),
                   description="Median over ranks of each rank's rolling-median step time."),
        stat_panel("Tokens per second", "short", ok("blue"),
                   Q(f"sum(rate(fleetscope_training_tokens_total{{{J}}}[5m]))")),
        stat_panel("Since last progress", "s", rising(120, 600),
                   Q(f"time() - max(fleetscope_training_last_step_timestamp_seconds{{{J}}})"),
                   description="Seconds since the newest step of any rank. Minutes without progress: a hang."),
        stat_panel("Slowest rank vs stage median", "percentunit", rising(1.1, 1.25),
                   Q(f"max({exprs.relative_compute(J)})"),
                   description="Above 110%: a straggler (about 10% slower machines, as MegaScale found)."),
        stat_panel("Lagging ranks", "none", rising(1, 1),
                   Q(f"count(fleetscope_training_last_step{{{J}}} < on (cluster, training_job) group_left () "
                     f"max by (cluster, training_job) (fleetscope_training_last_step{{{J}}})) or vector(0)"),
                   description="Ranks behind the newest step; in a hang these are the suspects."),
    ]
    speed = [
        timeseries_panel("Step time", "s", ok(),
                         Q(exprs.mean_step_seconds(J, "training_job", "$__rate_interval"), "mean over ranks"),
                         Q(f"quantile(0.5, fleetscope_training_step_seconds_median{{{J}}})", "median rank (rolling)"),
                         Q(f"max(fleetscope_training_step_seconds_median{{{J}}})", "slowest rank (rolling)"), width=8),
        timeseries_panel("Throughput", "short", ok(),
                         Q(f"sum(rate(fleetscope_training_tokens_total{{{J}}}{RATE}))", "tokens/s"),
                         Q(f"sum(rate(fleetscope_training_samples_total{{{J}}}{RATE}))", "samples/s"), width=8),
        timeseries_panel("Step time breakdown", "percentunit", rising(0.15, 0.25),
                         Q(_share("data"), "data wait"), Q(_share("compute"), "compute"),
                         Q(_share("comm"), "exposed communication"), width=8, stacked=True, minimum=0,
                         description="Share of step time per phase, job-wide. Data wait above 15%: input-bound; "
                                     "exposed communication above 25%: communication-bound."),
    ]
    stragglers = [
        heatmap_panel("Compute time relative to stage median, per rank", "percentunit", rising(1.1, 1.25),
                      Q(f"max by (rank) ({exprs.relative_compute(J)})", "{{rank}}"), low=0.8, high=1.3,
                      description="One row per rank; red cells are ranks computing slower than their pipeline "
                                  "stage's median. A persistently red row is a straggling GPU or node."),
        table_panel("Straggler candidates", "percentunit", rising(1.1, 1.25),
                    Q(exprs.worst_ranks(J), table=True), Q(exprs.cause_of_worst_ranks(J), table=True), width=24,
                    links=[link("Node detail", node_url("${__data.fields.instance}"))],
                    sort_by="Compute vs stage median",
                    rename={"Value #A": "Compute vs stage median", "Value #B": "Likely cause"},
                    column_units={"Likely cause": "none"}, value_mappings={"Likely cause": mappings(exprs.CAUSES)},
                    description="The slowest ranks with their node and GPU, and the first node-side signal that "
                                "explains them (Xid, clock slowdown, EFA retransmits, input wait)."),
        timeseries_panel("Data wait per rank", "percentunit", rising(0.05, 0.15),
                         Q(f"topk(10, max by (rank) (rate(fleetscope_training_data_seconds_total{{{J}}}{RATE}) "
                           f"/ rate(fleetscope_training_step_seconds_total{{{J}}}{RATE})))", "rank {{rank}}"),
                         description="The ten ranks waiting longest for input, as a share of their step time."),
        timeseries_panel("Exposed communication per rank", "percentunit", rising(0.25, 0.5),
                         Q(f"topk(10, max by (rank) (rate(fleetscope_training_comm_seconds_total{{{J}}}{RATE}) "
                           f"/ rate(fleetscope_training_step_seconds_total{{{J}}}{RATE})))", "rank {{rank}}"),
                         description="Ranks that wait most in collectives; the straggler is usually the one that "
                                     "waits least."),
    ]
    hang = [
        timeseries_panel("Progress per rank (last step)", "none", ok(),
                         Q(f"max by (rank) (fleetscope_training_last_step{{{J}}})", "rank {{rank}}"), width=12,
                         description="A rank whose line goes flat while others climb, or all flat at once: a hang."),
        bargauge_panel("Seconds since each rank's last step (worst 20)", "s", rising(120, 600),
                       Q(f"topk(20, max by (rank, instance) "
                         f"(time() - fleetscope_training_last_step_timestamp_seconds{{{J}}}))",
                         "rank {{rank}} on {{instance}}", instant=True), width=12,
                       links=[link("Node detail", node_url("${__field.labels.instance}"))]),
    ]
    gpus = [
        timeseries_panel("GPU utilization of the job's GPUs", "percentunit", falling(0.5, 0.8),
                         Q(_on_job_gpus("fleetscope_gpu_utilization_ratio"), "rank {{rank}}"), width=8,
                         minimum=0, maximum=1),
        timeseries_panel("GPU power of the job's GPUs", "watt", rising(600, 700),
                         Q(_on_job_gpus("fleetscope_gpu_power_watts"), "rank {{rank}}"), width=8),
        timeseries_panel("GPU temperature of the job's GPUs", "celsius", rising(80, 87),
                         Q(_on_job_gpus("fleetscope_gpu_temperature_celsius"), "rank {{rank}}"), width=8),
    ]
    return build_dashboard(
        UID_JOB, "fleetscope / Training job",
        "One training job: step time, throughput, per-rank compute relative to the stage median, straggler "
        "candidates with likely causes, time breakdown and per-rank progress for hang diagnosis.",
        variables,
        [("Summary", summary), ("Speed", speed), ("Stragglers", stragglers), ("Hang diagnosis", hang),
         ("GPUs of this job", gpus)],
        annotations=[alerts_annotation(J)],
    )
