"""Training rules: stragglers, slowdown, hangs, silent ranks and bottlenecks.

Ranks are compared on compute time, never step time (in synchronous training
a slow rank turns into collective wait on all the others), and only within
their pipeline stage (stages do different work). A straggler is judged on
evidence that accumulates: every minute, each rank's mean compute time per step
(from its counters) over its stage's median is one sample; the lower confidence
bound on the samples' median over 5 and 10 minutes, against the rank's own noise
pooled with its peers', must exceed a threshold that follows the job's own
spread between ranks (a robust SD from the median absolute deviation), never
below ``straggler_min_excess``.
"""

from __future__ import annotations

import dataclasses

from fleetscope.metrics import training
from fleetscope.promql import (
    GPU_BUSY,
    JOB_COMPUTE_RATIO_NOISE,
    JOB_COMPUTE_RATIO_SPREAD,
    JOB_KEY,
    JOB_MIN_COMM_SHARE,
    JOB_RANKS_COMPARED,
    JOB_RUNNING_RANKS,
    JOB_STEP,
    JOB_STEP_RATE,
    JOB_STRAGGLER_THRESHOLD,
    JOB_TOKEN_RATE,
    NODE_CLOCK_OFFSET,
    NODE_JOB_STRAGGLERS,
    RANK_COMM_SHARE_TYPICAL,
    RANK_COMPUTE_RATIO,
    RANK_COMPUTE_RATIO_BOUND,
    RANK_COMPUTE_RATIO_NOISE,
    RANK_COMPUTE_RATIO_SAMPLES,
    RANK_COMPUTE_RATIO_SMOOTHED,
    RANK_COMPUTE_STEP,
    RANK_ENDED,
    RANK_GPU,
    RANK_KEY,
    RANK_STOPPED,
    STAGE_COMPUTE,
    STAGE_KEY,
    STRAGGLER_CAUSE,
    STRAGGLER_CAUSES,
    STRAGGLERS,
    indent,
    job_share,
    on_gpu,
    rank_share,
)
from fleetscope.rules.model import Alert, Group, Record, held, num, sel
from fleetscope.rules.settings import Settings

RANK_LABELS = (
    "training job {{ $labels.training_job }} rank {{ $labels.rank }} (pp_stage {{ $labels.pp_stage }}) on "
    "{{ $labels.instance }}{{ with $labels.gpu }} GPU {{ . }}{{ end }}"
)


def rank_gpu(s: Settings) -> str:
    """The rank -> GPU map: rank_info as scraped now, else as last scraped within the gap window (so a missed
    scrape keeps the map, and a restart onto another GPU maps the new one at once instead of two). A rank
    without rank_info (a daemon that exports none) is mapped without ``gpu`` from its process state or its
    compute counter, so the rules that join the map still name it dead, hung, silent or slow."""
    info = sel(s, training.RANK_INFO)
    seen = (training.PROCESS_UP, training.COMPUTE_SECONDS_TOTAL)
    return (
        f"max by (cluster, {RANK_KEY}, gpu) (\n"
        f"  {info}\n    or on ({RANK_KEY})\n  {held(s, training.RANK_INFO)}\n"
        f")\n"
        f"  or on ({RANK_KEY})\n"
        f"group by (cluster, {RANK_KEY}) (\n  " + "\n  or\n  ".join(sel(s, m) for m in seen) + "\n)"
    )


def stopped(s: Settings) -> str:
    """Ranks that stopped (value 1): said goodbye (``phase="ended"``, read raw so that it counts at the next
    evaluation), process gone, or no report for ``running_report_seconds`` (on Prometheus's clock)."""
    last_push = sel(s, training.LAST_PUSH_TIMESTAMP_SECONDS)
    return (
        f"group by (cluster, {RANK_KEY}) (\n"
        f"  {ended(s)} == 1\n"
        f"  or\n"
        f"  {sel(s, training.PROCESS_UP)} == 0\n"
        f"  or\n"
        f"  {last_push}\n    + on (instance) group_left ()\n  {NODE_CLOCK_OFFSET}\n"
        f"    < time() - {num(s.running_report_seconds)}\n"
        f")"
    )


def ended(s: Settings) -> str:
    return sel(s, training.PHASE, 'phase="ended"')


def unless_ended(s: Settings, expr: str) -> str:
    """``expr`` for jobs none of whose ranks said goodbye at the last scrape: read raw, so that an alert about a
    job neither becomes pending nor fires at the first evaluation after its end (the records that leave a
    stopped rank out are an evaluation behind)."""
    return f"{expr}\n  unless on ({JOB_KEY})\n{ended(s)} == 1"


def running_ranks(s: Settings) -> str:
    """Per job, its ranks that have stepped (a step-time counter or median) and have not stopped."""
    stepped = f"{sel(s, training.STEP_SECONDS_TOTAL)}\n    or\n  {sel(s, training.STEP_SECONDS_MEDIAN)}"
    return (
        f"count by ({JOB_KEY}) (\n  group by (cluster, {RANK_KEY}) (\n    {indent(stepped, '    ')}\n  )\n"
        f"    unless on ({RANK_KEY})\n  {RANK_STOPPED}\n)"
    )


def straggler_threshold(s: Settings) -> str:
    """1 + max(floor, robust SD x (sqrt(2 ln N) + margin)), the floor alone for jobs of too few ranks.

    sqrt(2 ln N) is about how many SDs the largest of N healthy ranks sits out: a job of 1,000 ranks
    needs a higher bar than one of 8 for the same spread.
    """
    ranks = JOB_RANKS_COMPARED
    return (
        f"1 + (\n"
        f"  clamp_min(\n"
        f"    {JOB_COMPUTE_RATIO_SPREAD}\n"
        f"      * on ({JOB_KEY})\n"
        f"    (sqrt(2 * ln({ranks})) + {num(s.straggler_spread_margin)}),\n"
        f"    {num(s.straggler_min_excess)}\n"
        f"  )\n"
        f"    and on ({JOB_KEY})\n"
        f"  {ranks} >= {num(s.straggler_spread_min_ranks)}\n"
        f"  or\n"
        f"  {ranks} * 0 + {num(s.straggler_min_excess)}\n"
        f")"
    )


def lower_bound(s: Settings, window: str, median: str, noise: str, count: str) -> str:
    """The lower confidence bound on a rank's median ratio over ``window``: median - z x 1.2533 x sigma / sqrt(n)
    (1.2533 sigma / sqrt(n): the standard error of a median), sigma the quadratic mean of the rank's own SD and its
    job's median SD; only with ``straggler_min_samples`` samples in the window."""
    sigma = f"sqrt(({noise} ^ 2 + on ({JOB_KEY}) group_left {JOB_COMPUTE_RATIO_NOISE} ^ 2) / 2)"
    return (
        f"(\n  {median}\n    -\n  {num(s.straggler_confidence * 1.2533)} * {sigma}\n    /\n  sqrt({count})\n)\n"
        f"  and\n{count} >= {num(s.straggler_min_samples)}"
    )


def straggler_bounds(s: Settings) -> tuple[Record, ...]:
    """The lower bound over the short and over the long window, one series each (label ``window``): the short one
    names a slowdown that began in an old job sooner, the long one has the evidence of more samples. A rank is
    judged on the larger."""
    short = lower_bound(
        s, s.straggler_short_window,
        f"quantile_over_time(0.5, {RANK_COMPUTE_RATIO}[{s.straggler_short_window}])",
        f"stddev_over_time({RANK_COMPUTE_RATIO}[{s.straggler_short_window}])",
        f"count_over_time({RANK_COMPUTE_RATIO}[{s.straggler_short_window}])",
    )
    long = lower_bound(s, s.straggler_window, RANK_COMPUTE_RATIO_SMOOTHED, RANK_COMPUTE_RATIO_NOISE,
                       RANK_COMPUTE_RATIO_SAMPLES)
    return (
        Record(RANK_COMPUTE_RATIO_BOUND, short, {"window": s.straggler_short_window}),
        Record(RANK_COMPUTE_RATIO_BOUND, long, {"window": s.straggler_window}),
    )


def recording_rules(s: Settings) -> list[Group]:
    """The rank -> GPU map and the ranks that stopped (at ``training_evaluation_interval``); each rank's samples
    of its compute ratio and their median and noise over the straggler window; the job's spread, noise and
    threshold and each rank's lower bound (both at ``straggler_sample_window``, so that samples do not
    overlap). A group's rules run one after another, groups side by side. The flags (:func:`flag_records`) open
    the cause verdict's group, which reads them at the same evaluation.

    The ratio joins the map as its group last wrote it (a rank restarted onto another GPU carries the old one for
    up to an evaluation, as every reader of the map does); the spread group reads the medians of the evaluation
    before."""
    # A sample is a mean over every step of the window, from the counters: a GC pause or a checkpoint inside
    # a step moves one sample, which the median over the window does not follow. A rank without a step in the
    # window (hung, paused) has no sample; one that stopped has none either.
    w = s.straggler_sample_window
    steps = f"(increase({sel(s, training.STEPS_TOTAL)}[{w}]) > 0)"
    mean = (
        f"increase({sel(s, training.COMPUTE_SECONDS_TOTAL)}[{w}])\n  /\n{steps}\n"
        f"  unless on ({RANK_KEY})\n{RANK_STOPPED}"
    )
    ratio = f"{RANK_COMPUTE_STEP}\n  / on ({STAGE_KEY}) group_left\n{STAGE_COMPUTE}"
    ratios = (
        Record(RANK_COMPUTE_STEP, mean),
        Record(STAGE_COMPUTE, f"quantile by ({STAGE_KEY}) (0.5, {RANK_COMPUTE_STEP})"),
        Record(RANK_COMPUTE_RATIO, on_gpu(f"(\n  {indent(ratio)}\n)")),
        Record(RANK_COMPUTE_RATIO_SMOOTHED, f"quantile_over_time(0.5, {RANK_COMPUTE_RATIO}[{s.straggler_window}])"),
        Record(RANK_COMPUTE_RATIO_NOISE, f"stddev_over_time({RANK_COMPUTE_RATIO}[{s.straggler_window}])"),
        Record(RANK_COMPUTE_RATIO_SAMPLES, f"count_over_time({RANK_COMPUTE_RATIO}[{s.straggler_window}])"),
    )
    spread = (
        Record(JOB_COMPUTE_RATIO_SPREAD, (
            f"clamp_min(\n"
            f"  1.4826 * quantile by ({JOB_KEY}) (0.5, abs({RANK_COMPUTE_RATIO_SMOOTHED} - 1))\n"
            f"    -\n"
            f"  quantile by ({JOB_KEY}) (\n"
            f"    0.5, 1.2533 * {RANK_COMPUTE_RATIO_NOISE} / sqrt({RANK_COMPUTE_RATIO_SAMPLES})\n"
            f"  ),\n"
            f"  0\n"
            f")"
        )),
        Record(JOB_RANKS_COMPARED, f"count by ({JOB_KEY}) ({RANK_COMPUTE_RATIO_SMOOTHED})"),
        Record(JOB_COMPUTE_RATIO_NOISE, f"quantile by ({JOB_KEY}) (0.5, {RANK_COMPUTE_RATIO_NOISE})"),
        Record(JOB_STRAGGLER_THRESHOLD, straggler_threshold(s)),
        *straggler_bounds(s),
    )
    return [
        Group("fleetscope-rank-gpu.rules", (
            Record(RANK_GPU, rank_gpu(s)),
            Record(RANK_STOPPED, stopped(s)),
            Record(JOB_RUNNING_RANKS, running_ranks(s)),
        ), interval=s.training_evaluation_interval),
        Group("fleetscope-training.rules", ratios, interval=w),
        Group("fleetscope-training-spread.rules", spread, interval=w),
    ]


def flag_records(s: Settings) -> tuple[Record, ...]:
    """The flagged ranks and their count per node and job: first in the cause verdict's group."""
    return (
        Record(STRAGGLERS, (
            f"{RANK_COMPUTE_RATIO_SMOOTHED}\n"
            f"  and on ({RANK_KEY})\n"
            f"(\n  max without (window) ({RANK_COMPUTE_RATIO_BOUND})\n    > on ({JOB_KEY}) group_left\n"
            f"  {JOB_STRAGGLER_THRESHOLD}\n)\n"
            # Only a rank with a sample now: the window's evidence outlives a rank that stopped by a window.
            f"  and on ({RANK_KEY})\n{RANK_COMPUTE_RATIO}\n"
            f"  unless on ({RANK_KEY})\n{RANK_STOPPED}\n"
            # A goodbye read raw: no rank of a job that is ending is flagged at the evaluation after it.
            f"  unless on ({JOB_KEY})\n{ended(s)} == 1"
        )),
        Record(NODE_JOB_STRAGGLERS, f"count by (cluster, instance, training_job) ({STRAGGLERS})"),
    )


def pace_rules(s: Settings) -> list[Group]:
    """A job's pace and where its ranks' time goes: read by alerts that wait 10m or more, the goodput rules, the
    hang threshold and the dashboards, none of which needs them every 30s; at ``record_evaluation_interval``.
    Three groups (a group's rules run one after another, groups side by side; together they took 1.5 s an
    evaluation at 2,048 nodes): the pace, and each share with the job median that reads it at the same evaluation."""
    w = s.share_window
    # Ranks that said goodbye keep their last medians for a while (the last scrapes see their final counts): a
    # job's pace is its running ranks'. Frozen, an ended job read as slower than itself 3 minutes before (its
    # first steps ran on the loader's prefetched batches) and raised TrainingJobSlowdown after it finished.
    running = f"{sel(s, training.STEP_SECONDS_MEDIAN)}\n    unless on ({RANK_KEY})\n  {RANK_ENDED}"
    pace = [
        Record(JOB_STEP, f"quantile by ({JOB_KEY}) (\n  0.5,\n  {running}\n)"),
        Record(JOB_STEP_RATE, f"avg by ({JOB_KEY}) (rate({sel(s, training.STEPS_TOTAL)}[{w}]))"),
        Record(JOB_TOKEN_RATE, f"sum by ({JOB_KEY}) (rate({sel(s, training.TOKENS_TOTAL)}[{w}]))"),
        Record(RANK_COMM_SHARE_TYPICAL, (
            f"{sel(s, training.COMM_SECONDS_MEDIAN)}\n  /\n{sel(s, training.STEP_SECONDS_MEDIAN)}\n"
            f"  unless on ({RANK_KEY})\n{RANK_STOPPED}"
        )),
        Record(JOB_MIN_COMM_SHARE, f"min by ({JOB_KEY}) ({RANK_COMM_SHARE_TYPICAL})"),
    ]
    groups = [Group("fleetscope-training-pace.rules", tuple(pace), interval=s.record_evaluation_interval)]
    step_rate = f"rate({sel(s, training.STEP_SECONDS_TOTAL)}[{w}])"
    parts = {"input": ("data", training.DATA_SECONDS_TOTAL), "comm": ("comm", training.COMM_SECONDS_TOTAL)}
    for name, (part, counter) in parts.items():
        shares = (
            Record(rank_share(part), (
                f"rate({sel(s, counter)}[{w}])\n  /\n{step_rate}\n  unless on ({RANK_KEY})\n{RANK_STOPPED}"
            )),
            Record(job_share(part), f"quantile by ({JOB_KEY}) (0.5, {rank_share(part)})"),
        )
        groups.append(Group(f"fleetscope-training-{name}.rules", shares, interval=s.record_evaluation_interval))
    return groups


def cause_words() -> str:
    """Template turning the ``cause`` label into the words of :data:`fleetscope.promql.STRAGGLER_CAUSES`."""
    branches = [f'{"if" if i == 0 else "else if"} eq $labels.cause "{cause}" }}}}{words}'
                for i, (cause, words) in enumerate(STRAGGLER_CAUSES.items())]
    return "{{ " + "{{ ".join(branches) + "{{ end }}"


def threshold_text() -> str:
    return (
        f"{{{{ with printf `{JOB_STRAGGLER_THRESHOLD}{{training_job=\"%s\"}}` $labels.training_job | query }}}}"
        " (threshold {{ . | first | value | printf \"%.3f\" }}x){{ end }}"
    )


def node_causes_text() -> str:
    return (
        f"{{{{ with printf `count by (cause) ({STRAGGLER_CAUSE}{{instance=\"%s\",training_job=\"%s\"}})` "
        "$labels.instance $labels.training_job | query }} Causes: {{ range $i, $c := . }}{{ if $i }}, {{ end }}"
        "{{ $c.Labels.cause }} ({{ $c.Value }} ranks){{ end }}.{{ end }}"
    )


def worst_rank(part: str) -> str:
    """Template naming the rank with the largest share of ``part`` in a job."""
    return (
        f"{{{{ with printf `topk(1, {rank_share(part)}{{training_job=\"%s\"}})` $labels.training_job | query }}}}"
        "{{ with index . 0 }} The worst rank is {{ .Labels.rank }} on {{ .Labels.instance }} "
        "({{ .Value | humanizePercentage }}).{{ end }}{{ end }}"
    )


def alert_rules(s: Settings) -> Group:
    """The stragglers: evaluated at ``training_evaluation_interval``, at which their time to detect is measured."""
    stragglers_of_node = f"count by (cluster, instance, training_job) ({STRAGGLERS})"
    ranks_of_node = f"count by (cluster, instance, training_job) ({RANK_COMPUTE_RATIO_SMOOTHED})"
    alerts = [
        Alert(
            "TrainingStragglerRank",
            STRAGGLER_CAUSE,
            "warning",
            "A training rank computes slower than the other ranks of its pipeline stage.",
            f"In {RANK_LABELS} the median compute time is {{{{ printf \"%.3f\" $value }}}}x the stage median"
            f"{threshold_text()}. Cause ({{{{ $labels.cause }}}}): {cause_words()}.",
            s.straggler_for,
        ),
        Alert(
            "TrainingStragglerRank",
            f"{STRAGGLER_CAUSE} > 1 / {num(s.straggler_critical_score)}",  # relative score below it
            "critical",
            "A training rank computes far slower than the other ranks of its pipeline stage.",
            f"In {RANK_LABELS} the median compute time is {{{{ printf \"%.2f\" $value }}}}x the stage median: "
            f"relative score below {num(s.straggler_critical_score)}. The whole job runs at this rank's pace. "
            f"Cause ({{{{ $labels.cause }}}}): {cause_words()}.",
            s.straggler_critical_for,
        ),
        Alert(
            "TrainingStragglerNode",
            (
                f"{stragglers_of_node}\n"
                f"  / on (instance, training_job)\n"
                f"{ranks_of_node}\n"
                f"  > {num(s.straggler_node_fraction)}\n"
                f"and on (instance, training_job)\n"
                f"{ranks_of_node} > 1"
            ),
            "warning",
            "Most ranks on one node are stragglers: the node, not one GPU, is slow.",
            "{{ $value | humanizePercentage }} of the ranks of training job {{ $labels.training_job }} on "
            "{{ $labels.instance }} compute slower than their stage allows." + node_causes_text(),
            s.straggler_for,
        ),
    ]
    return Group("fleetscope-training", tuple(alerts), interval=s.training_evaluation_interval)



def pace_alert_rules(s: Settings) -> Group:
    """The job's pace and where its time goes: every alert waits a for: of 10m or more, so the group is
    evaluated at ``slow_evaluation_interval``."""
    w = s.share_window
    low_activity_expr = (
        f"(\n"
        f"  {held(s, training.RANK_INFO)}\n"
        f"    unless on ({RANK_KEY})\n"
        f"  {RANK_STOPPED}\n"
        f"    and on ({JOB_KEY})\n"
        f"  {JOB_STEP_RATE} > 0\n"
        f")\n"
        f"  * on (instance, gpu) group_left (uuid)\n"
        f"({GPU_BUSY} < {num(s.low_activity_ratio)})"
    )
    alerts = [
        Alert(
            "TrainingJobSlowdown",
            (
                f"avg_over_time({JOB_STEP}[{s.slowdown_window}])\n"
                f"  /\n"
                f"avg_over_time({JOB_STEP}[{s.slowdown_window}] offset {s.slowdown_baseline_offset})\n"
                f"  > {num(s.slowdown_ratio)}\n"
                # A job that makes no steps (hung, a rank dead, paused) keeps its last medians: frozen, they
                # read as slower than its first steps on the loader's prefetched batches. Its stop is
                # TrainingJobHang's or a pause, not a slower pace.
                f"  unless on ({JOB_KEY})\n"
                f"{JOB_STEP_RATE} == 0\n"
                # A job none of whose ranks runs (ended, gone, silent) is no slower: it stopped.
                f"  and on ({JOB_KEY})\n"
                f"{JOB_RUNNING_RANKS}"
            ),
            "warning",
            "A training job's steps are slower than its own recent baseline.",
            "The median step time of training job {{ $labels.training_job }} is {{ printf \"%.3f\" $value }}x its "
            f"value {s.slowdown_baseline_offset} earlier (threshold {num(s.slowdown_ratio)}x).",
            s.slowdown_for,
        ),
    ]
    for severity, share in (("warning", s.input_warning_share), ("critical", s.input_critical_share)):
        alerts.append(Alert(
            "TrainingInputBound",
            f"{job_share('data')} > {num(share)}\n  and on ({JOB_KEY})\n{JOB_RUNNING_RANKS}",
            severity,  # type: ignore[arg-type]
            "A training job waits on its input pipeline for a large share of each step.",
            "Ranks of training job {{ $labels.training_job }} spend a median {{ $value | humanizePercentage }} of "
            f"each step waiting for data (threshold {num(share * 100)}%)."
            + worst_rank("data"),
            s.input_for,
        ))
    # One rank's slow loader never moves the job median: its peers wait on it inside the
    # collective. So a rank above the threshold alerts on its own, naming the rank, unless the
    # whole job is input-bound (then the job alert above says it once).
    for severity, share in (("warning", s.input_warning_share), ("critical", s.input_critical_share)):
        alerts.append(Alert(
            "TrainingRankInputBound",
            on_gpu(
                f"(\n"
                f"  {rank_share('data')} > {num(share)}\n"
                f"    unless on (training_job)\n"
                f"  {job_share('data')} > {num(share)}\n"
                f"    unless on ({RANK_KEY})\n"
                f"  {RANK_STOPPED}\n"
                f")"
            ),
            severity,  # type: ignore[arg-type]
            "One training rank waits on its input pipeline while the rest of the job does not.",
            "Rank {{ $labels.rank }} of training job {{ $labels.training_job }} on {{ $labels.instance }}"
            "{{ with $labels.gpu }} (GPU {{ . }}){{ end }} spends {{ $value | humanizePercentage }} of each step "
            f"waiting for data (threshold {num(share * 100)}%); the job's median rank does not. Its peers wait "
            "for it in the collectives, so the whole job runs at this rank's pace.",
            s.input_for,
        ))
    # The least-waiting rank's exposed communication is what every rank pays for the collectives.
    # Time the others wait beyond it is waiting for a slower peer, which a rank below the straggler
    # threshold can cause too: the job median would call that a network problem, the minimum does not.
    # Typical (rolling-median) shares, not rates: every rank but the writer waits out a checkpoint.
    alerts.append(Alert(
        "TrainingCommunicationBound",
        (
            f"{JOB_MIN_COMM_SHARE} > {num(s.comm_share)}\n"
            f"unless on ({JOB_KEY})\n"
            f"{STRAGGLERS}\n"
            f"unless on (training_job)\n"
            f"({rank_share('data')} > {num(s.input_warning_share)})\n"
            f"and on ({JOB_KEY})\n"
            f"{JOB_RUNNING_RANKS}"
        ),
        "warning",
        "Every rank of a training job spends a large share of each step in exposed communication.",
        "Even the rank of training job {{ $labels.training_job }} that waits least spends "
        "{{ $value | humanizePercentage }} of each step in exposed communication "
        f"(threshold {num(s.comm_share * 100)}%): the collectives themselves are slow, not a peer. No rank is "
        "a straggler and no rank waits on its input."
        + worst_rank("comm"),
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
    gated = tuple(dataclasses.replace(a, expr=unless_ended(s, a.expr)) for a in alerts)
    return Group("fleetscope-training-pace", gated, interval=s.slow_evaluation_interval)

