"""Fleet overview: is the fleet healthy, which node is sick, which job is slow."""

from __future__ import annotations

from typing import Any

from fleetscope.dashboards import exprs
from fleetscope.dashboards.kit import (
    UID_FLEET,
    Q,
    alerts_annotation,
    bargauge_panel,
    build_dashboard,
    cluster_variable,
    falling,
    job_url,
    link,
    mappings,
    node_url,
    ok,
    rising,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from fleetscope.metrics import training
from fleetscope.promql import (
    JOB_GOODPUT,
    JOB_TOKEN_RATE,
    NODE_STRAGGLER_JOBS,
    NODE_STRAGGLER_WINDOWS,
    RANK_COMPUTE_RATIO_SMOOTHED,
    STRAGGLER_CAUSE,
    efa_rate,
)
from fleetscope.rules.settings import PRODUCTION

C = 'cluster=~"$cluster"'
# Expected GPUs per node: the configured count, else the GPUs seen on the PCI bus (a GPU that fell off NVML
# usually still enumerates on PCI).
EXPECTED_GPUS = f"(fleetscope_gpu_expected_devices{{{C}}} or fleetscope_gpu_pci_devices{{{C}}})"
NODE_LINK = link("Node detail", node_url("${__data.fields.instance}"))
JOB_LINK = link("Training job", job_url("${__data.fields.training_job}"))


def build() -> Any:
    summary = [
        stat_panel("Nodes reporting", "none", falling(1, 1), Q(f"count(fleetscope_build_info{{{C}}})"),
                   description="Nodes whose fleetscope daemon is scraped."),
        stat_panel("GPUs visible", "none", ok("blue"), Q(f"sum(fleetscope_gpu_nvml_devices{{{C}}})"),
                   description="GPUs NVML can see, fleet-wide."),
        stat_panel("GPUs expected", "none", ok("blue"), Q(f"sum({EXPECTED_GPUS})"),
                   description="Configured GPU count per node (else GPUs on the PCI bus), summed."),
        stat_panel("Nodes missing GPUs", "none", rising(1, 1),
                   Q(f"count({EXPECTED_GPUS} > fleetscope_gpu_nvml_devices{{{C}}}) or vector(0)"),
                   description="Nodes where NVML sees fewer GPUs than expected: drain candidates."),
        stat_panel("Firing alerts", "none", rising(1, 5), Q(f'count(ALERTS{{alertstate="firing", {C}}}) or vector(0)'),
                   description="Alerts currently firing in Prometheus (fleetscope rules included)."),
        stat_panel("Jobs running", "none", ok("blue"),
                   Q(f"count(count by (cluster, training_job) (fleetscope_training_last_step{{{C}}})) or vector(0)"),
                   description="Jobs with at least one rank pushing steps."),
    ]
    health = [
        bargauge_panel("Health findings by kind (firing alerts)", "none", rising(1, 5),
                       Q(f'count by (alertname, severity) (ALERTS{{alertstate="firing", {C}}})',
                         "{{alertname}} ({{severity}})", instant=True),
                       description="One bar per kind of finding, from the alert rules."),
        bargauge_panel("Xid events by action class (last hour)", "none", rising(1, 10),
                       Q(f"sum by (action) (increase(fleetscope_gpu_xid_errors_total{{{C}}}[1h]))", "{{action}}",
                         instant=True),
                       description="Xid errors grouped by NVIDIA's immediate-action class (RESET_GPU, RESTART_BM...)."),
        timeseries_panel("EFA error rates", "cps", rising(1, 100),
                         Q(f"{efa_rate('retransmit_packets')}{{{C}}}", "{{instance}} retransmits"),
                         Q(f"{efa_rate('rx_drops')}{{{C}}}", "{{instance}} drops"),
                         Q(f"sum by (instance) (rate(fleetscope_efa_impaired_remote_connection_events_total{{{C}}}"
                           f"[$__rate_interval]))", "{{instance}} impaired connections"),
                         width=8, links=[link("Node detail", node_url("${__field.labels.instance}"))],
                         description="Per node: EFA retransmitted packets, receive drops and impaired connections "
                                     "per second."),
        table_panel("ECC and row-remap state by node", "none", rising(1, 1),
                    Q(f'sum by (instance) (fleetscope_gpu_ecc_errors_total{{error_type="uncorrected", '
                      f'counter_type="volatile", {C}}})', table=True),
                    Q(f'sum by (instance) (fleetscope_gpu_remapped_rows{{cause="uncorrectable", {C}}})', table=True),
                    Q(f"sum by (instance) (fleetscope_gpu_row_remap_pending{{{C}}})", table=True),
                    Q(f"sum by (instance) (fleetscope_gpu_row_remap_failed{{{C}}})", table=True),
                    width=24, links=[NODE_LINK], sort_by="Uncorrected ECC (volatile)",
                    rename={"Value #A": "Uncorrected ECC (volatile)", "Value #B": "Uncorrectable remapped rows",
                            "Value #C": "Row remaps pending", "Value #D": "Row remaps failed"},
                    description="Per node, summed over its GPUs. A pending remap needs a GPU reset; "
                                "a failed one, an RMA."),
    ]
    warn, crit = exprs.STRAGGLER_WARN, exprs.STRAGGLER_CRIT
    jobs = [
        table_panel("Training jobs", "s", rising(600, 1800),
                    Q(exprs.mean_step_seconds(C, "cluster, training_job"), table=True),
                    Q(f"sum by (cluster, training_job) ({JOB_TOKEN_RATE}{{{C}}})", table=True),
                    Q(f"count by (cluster, training_job) ({training.LAST_STEP}{{{C}}})", table=True),
                    Q(f"time() - max by (cluster, training_job) {exprs.last_step_stamp(C)}",
                      table=True),
                    Q(f"max by (cluster, training_job) ({RANK_COMPUTE_RATIO_SMOOTHED}{{{C}}})", table=True),
                    Q(f"min by (cluster, training_job) ({JOB_GOODPUT}{{{C}}})", table=True),
                    width=24, links=[JOB_LINK], sort_by="Worst rank vs stage median",
                    rename={"Value #A": "Mean step time", "Value #B": "Tokens/s", "Value #C": "Ranks",
                            "Value #D": "Since last step", "Value #E": "Worst rank vs stage median",
                            "Value #F": "Goodput"},
                    column_units={"Mean step time": "s", "Tokens/s": "short", "Ranks": "none",
                                  "Since last step": "s", "Worst rank vs stage median": "percentunit",
                                  "Goodput": "percentunit"},
                    description="Jobs pushing steps. 'Since last step' above 10 min is a likely hang; 'Worst rank' is "
                                "the largest smoothed compute ratio (the straggler rule flags from "
                                f"{warn:.0%}); goodput is the job's best sustained step time over its current one."),
        table_panel("Flagged stragglers and their cause", "percentunit", rising(warn, crit),
                    Q(f"topk(20, {STRAGGLER_CAUSE}{{{C}}})", table=True),
                    width=24, links=[NODE_LINK, JOB_LINK], sort_by="Compute vs stage median",
                    rename={"Value": "Compute vs stage median", "cause": "Cause"},
                    column_units={"Cause": "none"},
                    value_mappings={"Cause": mappings(exprs.cause_mappings())},
                    description="The 20 flagged ranks furthest above their pipeline stage's median, with the cause "
                                "verdict the TrainingStragglerRank alert carries."),
        table_panel("Repeat offenders: nodes flagged slow again and again", "none",
                    rising(PRODUCTION.repeat_min_count, PRODUCTION.repeat_min_count),
                    Q(f"topk(20, {NODE_STRAGGLER_JOBS}{{{C}}})", table=True),
                    Q(f"topk(20, {NODE_STRAGGLER_WINDOWS}{{{C}}})", table=True),
                    width=24, links=[NODE_LINK], sort_by="Jobs",
                    rename={"Value #A": "Jobs", "Value #B": "Separate windows"},
                    description=f"Nodes whose ranks were flagged as stragglers, counted in distinct jobs and in "
                                f"separate windows within {PRODUCTION.repeat_window}. At "
                                f"{PRODUCTION.repeat_min_count:.0f} of either, TrainingNodeRepeatedlySlow asks to take "
                                "the node out of the pool."),
    ]
    return build_dashboard(
        UID_FLEET, "fleetscope / Fleet overview",
        "Is the fleet healthy, which node and GPU is sick, which job is slow. Click a node or job to drill down.",
        [cluster_variable()],
        [("Fleet", summary), ("Health", health), ("Jobs", jobs)],
        annotations=[alerts_annotation(C)],
    )
