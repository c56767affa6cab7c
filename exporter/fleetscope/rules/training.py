"""Training rules: stragglers, slowdown, hangs, silent ranks and bottlenecks.

Ranks are compared on compute time, never step time (in synchronous training
a slow rank turns into collective wait on all the others), and only within
their pipeline stage (stages do different work).
"""

from __future__ import annotations

from fleetscope import signals
from fleetscope.rules.model import Alert, Group, Record, num, sel
from fleetscope.rules.settings import Settings
from fleetscope.signals import (
    GPU_CLOCK_RATIO,
    GPU_THROTTLE_SHARE,
    JOB_STEP,
    JOB_STEP_RATE,
    JOB_TOKEN_RATE,
    NODE_SLOWDOWN_CAUSES,
    RANK_COMPUTE_RATIO,
    RANK_KEY,
    STAGE_COMPUTE,
    efa_rate,
    indent,
    job_share,
    rank_share,
)


def with_gpu(s: Settings, expr: str) -> str:
    return signals.with_gpu(expr, sel(s, "fleetscope_training_rank_info"))


def cause_text(gpu_scoped: bool) -> str:
    """Template listing the node's likely causes (recorded in CAUSES) for a description."""
    matcher = 'instance="%s",gpu=~"%s|"' if gpu_scoped else 'instance="%s"'
    args = "$labels.instance $labels.gpu" if gpu_scoped else "$labels.instance"
    return (
        f"{{{{ with printf `{NODE_SLOWDOWN_CAUSES}{{{matcher}}}` {args} | query }}}}"
        "Likely cause on the node: {{ range $i, $c := . }}{{ if $i }}, {{ end }}{{ $c.Labels.cause }}{{ end }}."
        "{{ else }}No GPU throttling, low clock, EFA or data-wait cause is visible on the node.{{ end }}"
    )


def worst_rank(s: Settings, part: str) -> str:
    """Template naming the rank with the largest share of ``part`` in a job."""
    return (
        f"{{{{ with printf `topk(1, {rank_share(part)}{{training_job=\"%s\"}})` $labels.training_job | query }}}}"
        "{{ with index . 0 }} The worst rank is {{ .Labels.rank }} on {{ .Labels.instance }} "
        "({{ .Value | humanizePercentage }}).{{ end }}{{ end }}"
    )


def recording_rules(s: Settings) -> Group:
    w = s.rate_window
    compute = sel(s, "fleetscope_training_compute_seconds_median")
    rules: list[Record] = [
        Record(STAGE_COMPUTE, f"quantile by (training_job, pp_stage) (0.5, {compute})"),
        Record(
            RANK_COMPUTE_RATIO, with_gpu(s, f"{compute}\n  / on (training_job, pp_stage) group_left\n{STAGE_COMPUTE}")
        ),
        Record(JOB_STEP, f"quantile by (training_job) (0.5, {sel(s, 'fleetscope_training_step_seconds_median')})"),
    ]
    step_rate = f"rate({sel(s, 'fleetscope_training_step_seconds_total')}[{w}])"
    for part in ("data", "comm"):
        part_rate = f"rate({sel(s, f'fleetscope_training_{part}_seconds_total')}[{w}])"
        rules.append(Record(rank_share(part), f"{part_rate}\n  /\n{step_rate}"))
        rules.append(Record(job_share(part), f"quantile by (training_job) (0.5, {rank_share(part)})"))
    rules.append(Record(
        JOB_STEP_RATE, f"avg by (training_job) (rate({sel(s, 'fleetscope_training_steps_total')}[{w}]))"))
    rules.append(Record(
        JOB_TOKEN_RATE, f"sum by (training_job) (rate({sel(s, 'fleetscope_training_tokens_total')}[{w}]))"))
    return Group("fleetscope-training.rules", tuple(rules))


def cause_rules(s: Settings) -> Group:
    """Per node (and GPU) indicators that explain a straggler, one series per ``cause``."""
    w = s.rate_window
    efa_errors = "\n  or\n  ".join(
        f"sum without (device, port) (increase({sel(s, name)}[{w}])) > 0"
        for name in (
            "fleetscope_efa_rx_drops_total",
            "fleetscope_efa_retransmit_timeout_events_total",
            "fleetscope_efa_unresponsive_remote_events_total",
            "fleetscope_efa_impaired_remote_connection_events_total",
        )
    )
    hw_reasons = 'reason=~"hw_slowdown|hw_thermal|sw_thermal|hw_power_brake"'
    pieces = [
        (
            "gpu_throttled",
            f"max without (reason) ({GPU_THROTTLE_SHARE}{{{hw_reasons}}}) > {num(s.cause_throttle_share)}",
        ),
        ("gpu_low_sm_clock", f"max without (clock) ({GPU_CLOCK_RATIO}) < {num(s.cause_clock_ratio)}"),
        ("efa_retransmits", f"{efa_rate('retransmit_packets')} > {num(s.efa_retransmit_cause_per_second)}"),
        ("efa_errors", f"(\n  {efa_errors}\n)"),
        ("data_wait", f"max by (instance) ({rank_share('data')}) > {num(s.input_warning_share)}"),
    ]
    expr = "\nor\n".join(
        f'label_replace(\n  {indent(piece)},\n  "cause", "{cause}", "", ""\n)' for cause, piece in pieces
    )
    return Group("fleetscope-causes.rules", (Record(NODE_SLOWDOWN_CAUSES, expr),))


def alert_rules(s: Settings) -> Group:
    w = s.rate_window
    rank_labels = (
        "training job {{ $labels.training_job }} rank {{ $labels.rank }} (pp_stage {{ $labels.pp_stage }}) "
        "on {{ $labels.instance }}{{ with $labels.gpu }} GPU {{ . }}{{ end }}"
    )
    last_step = sel(s, "fleetscope_training_last_step_timestamp_seconds")
    last_push = sel(s, "fleetscope_training_last_push_timestamp_seconds")
    hang_threshold = (
        f"clamp({num(s.hang_step_multiple)} * {JOB_STEP}, {num(s.hang_min_seconds)}, {num(s.hang_max_seconds)})\n"
        f"  or on (training_job)\n"
        f"max by (training_job) ({last_step}) * 0 + {num(s.hang_max_seconds)}"
    )
    hang_expr = with_gpu(s, (
        f"time() - (\n"
        f"  {last_step}\n"
        f"    == on (training_job) group_left\n"
        f"  min by (training_job) ({last_step})\n"
        f")\n"
        f"and on (training_job)\n"
        f"(\n"
        f"  time() - max by (training_job) ({last_step})\n"
        f"    > on (training_job)\n"
        f"  (\n    {indent(hang_threshold, '    ')}\n  )\n"
        f")"
    ))
    silent = num(s.silent_after_seconds)
    silent_expr = with_gpu(s, (
        f"time() - {last_push} > {silent}\n"
        f"and on (training_job)\n"
        f"(time() - max by (training_job) ({last_push}) < {silent})"
    ))
    activity = (
        f"avg_over_time({sel(s, 'fleetscope_gpu_sm_active_ratio')}[{w}])\n"
        f"  or\n"
        f"avg_over_time({sel(s, 'fleetscope_gpu_utilization_ratio')}[{w}])"
    )
    low_activity_expr = (
        f"(\n"
        f"  {sel(s, 'fleetscope_training_rank_info')}\n"
        f"    and on ({RANK_KEY})\n"
        f"  rate({sel(s, 'fleetscope_training_steps_total')}[{w}]) > 0\n"
        f")\n"
        f"  * on (instance, gpu) group_left (uuid)\n"
        f"(\n"
        f"  (\n    {indent(activity, '    ')}\n  ) < {num(s.low_activity_ratio)}\n"
        f")"
    )
    alerts = [
        Alert(
            "TrainingStragglerRank",
            f"{RANK_COMPUTE_RATIO} > {num(s.straggler_ratio)}",
            "warning",
            "A training rank computes slower than the other ranks of its pipeline stage.",
            f"In {rank_labels} the median compute time is {{{{ printf \"%.2f\" $value }}}}x the stage median "
            f"(threshold {num(s.straggler_ratio)}x). {cause_text(True)}",
            s.straggler_for,
        ),
        Alert(
            "TrainingStragglerRank",
            f"{RANK_COMPUTE_RATIO} > 1 / {num(s.straggler_critical_score)}",  # relative score below it
            "critical",
            "A training rank computes far slower than the other ranks of its pipeline stage.",
            f"In {rank_labels} the median compute time is {{{{ printf \"%.2f\" $value }}}}x the stage median: "
            f"relative score below {num(s.straggler_critical_score)}. The whole job runs at this rank's pace. "
            f"{cause_text(True)}",
            s.straggler_critical_for,
        ),
        Alert(
            "TrainingStragglerNode",
            (
                f"count by (instance, training_job) ({RANK_COMPUTE_RATIO} > {num(s.straggler_ratio)})\n"
                f"  / on (instance, training_job)\n"
                f"count by (instance, training_job) ({RANK_COMPUTE_RATIO})\n"
                f"  > {num(s.straggler_node_fraction)}\n"
                f"and on (instance, training_job)\n"
                f"count by (instance, training_job) ({RANK_COMPUTE_RATIO}) > 1"
            ),
            "warning",
            "Most ranks on one node are stragglers: the node, not one GPU, is slow.",
            "{{ $value | humanizePercentage }} of the ranks of training job {{ $labels.training_job }} on "
            f"{{{{ $labels.instance }}}} compute more than {num(s.straggler_ratio)}x slower than their stage. "
            f"{cause_text(False)}",
            s.straggler_for,
        ),
        Alert(
            "TrainingJobSlowdown",
            (
                f"avg_over_time({JOB_STEP}[{s.slowdown_window}])\n"
                f"  /\n"
                f"avg_over_time({JOB_STEP}[{s.slowdown_window}] offset {s.slowdown_baseline_offset})\n"
                f"  > {num(s.slowdown_ratio)}"
            ),
            "warning",
            "A training job's steps are slower than its own recent baseline.",
            "The median step time of training job {{ $labels.training_job }} is {{ printf \"%.3f\" $value }}x its "
            f"value {s.slowdown_baseline_offset} earlier (threshold {num(s.slowdown_ratio)}x).",
            s.slowdown_for,
        ),
        Alert(
            "TrainingJobHang",
            hang_expr,
            "critical",
            "A training job has made no step progress for many step times.",
            "No rank of training job {{ $labels.training_job }} has completed a step for "
            f"{num(s.hang_step_multiple)}x the median step time (clamped to {num(s.hang_min_seconds)}s-"
            f"{num(s.hang_max_seconds)}s). Suspect: rank {{{{ $labels.rank }}}} on {{{{ $labels.instance }}}}"
            "{{ with $labels.gpu }} GPU {{ . }}{{ end }}, the first to stop: its last step completed "
            "{{ $value | humanizeDuration }} ago"
            "{{ with printf `" + sel(s, "fleetscope_training_last_step", 'training_job="%s", rank="%s"') + "` "
            "$labels.training_job $labels.rank | query }} at step {{ . | first | value }}{{ end }}"
            "{{ with printf `max(" + sel(s, "fleetscope_training_last_step", 'training_job="%s"') + ")` "
            "$labels.training_job | query }} (furthest rank: step {{ . | first | value }}){{ end }}.",
            s.hang_for,
        ),
        Alert(
            "TrainingRankSilent",
            silent_expr,
            "warning",
            "A training rank stopped pushing step data while the other ranks go on.",
            f"{rank_labels[0].upper()}{rank_labels[1:]} last pushed {{{{ $value | humanizeDuration }}}} ago; "
            "other ranks of the job pushed recently.",
            s.silent_for,
        ),
    ]
    for severity, share in (("warning", s.input_warning_share), ("critical", s.input_critical_share)):
        alerts.append(Alert(
            "TrainingInputBound",
            f"{job_share('data')} > {num(share)}",
            severity,  # type: ignore[arg-type]
            "A training job waits on its input pipeline for a large share of each step.",
            "Ranks of training job {{ $labels.training_job }} spend a median {{ $value | humanizePercentage }} of "
            f"each step waiting for data (threshold {num(share * 100)}%)."
            + worst_rank(s, "data"),
            s.input_for,
        ))
    # One rank's slow loader never moves the job median: its peers wait on it inside the
    # collective. So a rank above the threshold alerts on its own, naming the rank, unless the
    # whole job is input-bound (then the job alert above says it once).
    for severity, share in (("warning", s.input_warning_share), ("critical", s.input_critical_share)):
        alerts.append(Alert(
            "TrainingRankInputBound",
            with_gpu(s, (
                f"{rank_share('data')} > {num(share)}\n"
                f"unless on (training_job)\n"
                f"{job_share('data')} > {num(share)}"
            )),
            severity,  # type: ignore[arg-type]
            "One training rank waits on its input pipeline while the rest of the job does not.",
            "Rank {{ $labels.rank }} of training job {{ $labels.training_job }} on {{ $labels.instance }}"
            "{{ with $labels.gpu }} (GPU {{ . }}){{ end }} spends {{ $value | humanizePercentage }} of each step "
            f"waiting for data (threshold {num(share * 100)}%); the job's median rank does not. Its peers wait "
            "for it in the collectives, so the whole job runs at this rank's pace.",
            s.input_for,
        ))
    alerts.append(Alert(
        "TrainingCommunicationBound",
        (
            f"{job_share('comm')} > {num(s.comm_share)}\n"
            f"unless on (training_job)\n"
            f"({RANK_COMPUTE_RATIO} > {num(s.straggler_ratio)})\n"
            f"unless on (training_job)\n"
            f"({rank_share('data')} > {num(s.input_warning_share)})"
        ),
        "warning",
        "A training job spends a large share of each step in exposed communication, with no straggler.",
        "Ranks of training job {{ $labels.training_job }} spend a median {{ $value | humanizePercentage }} of "
        f"each step in exposed communication (threshold {num(s.comm_share * 100)}%), no rank is a straggler "
        "and no rank waits on its input."
        + worst_rank(s, "comm"),
        s.comm_for,
    ))
    alerts.append(Alert(
        "TrainingLowGpuActivity",
        low_activity_expr,
        "warning",
        "A GPU of a training rank is mostly idle while the job makes steps.",
        f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.instance }}}} (training job {{{{ $labels.training_job }}}} rank "
        f"{{{{ $labels.rank }}}}) averaged {{{{ $value | humanizePercentage }}}} activity over {w} "
        f"(threshold {num(s.low_activity_ratio * 100)}%) while the rank completes steps.",
        s.low_activity_for,
    ))
    return Group("fleetscope-training", tuple(alerts))
