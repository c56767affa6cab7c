"""The PromQL vocabulary shared by the rules and the dashboards.

Recording-rule names live here, once: ``fleetscope.rules`` records them and
``fleetscope.dashboards`` reads them, so a dashboard panel and an alert that
show the same signal read the same series. Names follow Prometheus's
``level:metric:operations`` convention without the window: the production
rules and the time-compressed e2e preset record the same names (over 5m and
1m windows), so every dashboard works against either.

The helpers at the end build PromQL that both sides need (a rank's GPU label,
indentation of nested expressions). Nothing here imports the rule settings
or the Grafana SDK. A new recording rule elsewhere (progress, NCCL) puts its
name here too.
"""

from __future__ import annotations

# -- label sets ---------------------------------------------------------------------------------------

# Labels that identify one rank's series (besides the scrape job). Job-level aggregates keep `cluster`
# too, so a dashboard's cluster filter still matches where Prometheus adds it as a target label.
RANK_KEY = "instance, training_job, rank"
JOB_KEY = "cluster, training_job"
STAGE_KEY = "cluster, training_job, pp_stage"

# -- training: stragglers --------------------------------------------------------------------------

# Each rank's mean compute time per step over the last sample window (its counters' increase: every step counts
# once, whatever the daemon's rolling window), a sample every straggler_sample_window.
RANK_COMPUTE_STEP = "rank:fleetscope_training_compute_seconds_per_steps:ratio_increase"
# Median over a pipeline stage's ranks of those means.
STAGE_COMPUTE = "training_job_pp_stage:fleetscope_training_compute_seconds_per_steps:median"
# A rank's mean over its stage's median (1.0 = typical), with `gpu` from rank_info: one sample of the evidence.
RANK_COMPUTE_RATIO = "rank:fleetscope_training_compute_seconds_per_steps:ratio_stage_median"
# The samples' median over the straggler window: how much slower the rank is, the value its alert says.
RANK_COMPUTE_RATIO_SMOOTHED = "rank:fleetscope_training_compute_seconds_per_steps:ratio_stage_median_over_time"
# The samples' standard deviation over the straggler window: the rank's own noise.
RANK_COMPUTE_RATIO_NOISE = "rank:fleetscope_training_compute_seconds_per_steps:ratio_stddev_over_time"
# The number of samples over the straggler window (it grows from a job's start to the window's length).
RANK_COMPUTE_RATIO_SAMPLES = "rank:fleetscope_training_compute_seconds_per_steps:ratio_count_over_time"
# Per job, the median of its ranks' noise: the peers' noise, which a rank's own is pooled with.
JOB_COMPUTE_RATIO_NOISE = "training_job:fleetscope_training_compute_seconds_per_steps:ratio_stddev_median"
# The lower confidence bound on a rank's median ratio, the larger over the short and the long window: the evidence.
RANK_COMPUTE_RATIO_BOUND = "rank:fleetscope_training_compute_seconds_per_steps:ratio_lower_bound"
# A job's robust spread of the window medians: 1.4826 x their median absolute deviation from 1, less their median
# standard error (the medians' own noise), at least 0: how much its ranks really differ.
JOB_COMPUTE_RATIO_SPREAD = "training_job:fleetscope_training_compute_seconds_per_steps:ratio_robust_sd"
# Ranks of a job with a window median: the N of the threshold's expected largest of N healthy ranks.
JOB_RANKS_COMPARED = "training_job:fleetscope_training_compute_seconds_per_steps:count"
# The ratio a rank's lower bound must exceed to be a straggler.
JOB_STRAGGLER_THRESHOLD = "training_job:fleetscope_training_compute_seconds_per_steps:straggler_threshold"
# Flagged ranks only: the window median of every rank whose lower bound is above its job's threshold.
STRAGGLERS = "rank:fleetscope_training_straggler:compute_ratio"
# The cause verdict: every flagged rank once, labelled `cause` (see STRAGGLER_CAUSES), value = its ratio.
STRAGGLER_CAUSE = "rank:fleetscope_training_straggler:cause"
# Flagged ranks per job and cause.
JOB_STRAGGLER_CAUSES = "training_job:fleetscope_training_straggler:count_by_cause"
# Per node (and GPU) evidence the verdict reads, one series per `cause` (gpu_xid, gpu_throttled, network).
NODE_SLOWDOWN_CAUSES = "instance_gpu:fleetscope_slowdown_cause:present"

# The causes, in the verdict's order (first match wins), with the words alerts and dashboards show.
STRAGGLER_CAUSES: dict[str, str] = {
    "gpu_xid": "an Xid on its GPU",
    "gpu_throttled": "its GPU is throttled (thermal, HW slowdown, power brake) or clocked below its node's peers",
    "input_wait": "it waits on its own input pipeline",
    "network": "EFA retransmits, drops or errors, or ENA allowance shaping, on its node",
    "host_cpu": "its GPU is less busy than its peers': the host does not feed it fast enough",
    "unknown": "no GPU, input, network or host signal explains it: compare its code path, data shard and host",
}

# -- training: phases and pace ------------------------------------------------------------------------

# Median over a job's running ranks (not those that said goodbye) of each rank's rolling-median step time.
JOB_STEP = "training_job:fleetscope_training_step_seconds_median:median"
# Share of a rank's step time spent waiting for data / in exposed communication (rates over the window).
RANK_DATA_SHARE = "rank:fleetscope_training_data_seconds_per_step_seconds:ratio_rate"
RANK_COMM_SHARE = "rank:fleetscope_training_comm_seconds_per_step_seconds:ratio_rate"
# The same shares, median over the job's ranks.
JOB_DATA_SHARE = "training_job:fleetscope_training_data_seconds_per_step_seconds:median_ratio_rate"
JOB_COMM_SHARE = "training_job:fleetscope_training_comm_seconds_per_step_seconds:median_ratio_rate"
# A rank's typical exposed communication: its rolling-median comm time over its rolling-median step time
# (a checkpoint or other rare stall, which every peer waits out, does not move it).
RANK_COMM_SHARE_TYPICAL = "rank:fleetscope_training_comm_seconds_median:ratio_step_median"
# The job's least-waiting rank's typical share: what every rank pays for the collectives, not waiting on a peer.
JOB_MIN_COMM_SHARE = "training_job:fleetscope_training_comm_seconds_median:min_ratio_step_median"
# Steps per second (mean over ranks) and tokens per second (sum over ranks) of a job.
JOB_STEP_RATE = "training_job:fleetscope_training_steps:avg_rate"
JOB_TOKEN_RATE = "training_job:fleetscope_training_tokens:rate"
# How busy each rank's GPU was (SM activity where GPM reports it, else utilization), per rank.
RANK_GPU_BUSY = "rank:fleetscope_gpu_busy_ratio:avg_over_time"


# -- training: placement -----------------------------------------------------------------------------

# The rank -> GPU map, recorded once (first rule of fleetscope-training.rules): value 1 per rank with its
# `gpu` label from rank_info, held over a missed scrape. A rank without rank_info is mapped without `gpu`.
# Every rule that names a rank's GPU joins it with one line: `* on (instance, training_job, rank) group_left
# (gpu)` (on_gpu).
RANK_GPU = "rank:fleetscope_training_rank_info:gpu"


# -- training: progress (rules/progress.py) -----------------------------------------------------------

# Per node: Prometheus's clock minus the node's, from the scrape's own clock reading (the sample's time
# minus fleetscope_push_scrape_timestamp_seconds; 0 for a daemon that does not export it). Every node
# timestamp a rule compares with time() is moved onto Prometheus's clock with it, so a step of the node's
# wall clock (NTP at boot, after a suspend) moves no age (docs/reliability.md).
NODE_CLOCK_OFFSET = "instance:fleetscope_push_scrape_timestamp_seconds:offset"
# Per job and phase: how many of its ranks are in that phase now (ranks that said goodbye under "ended").
JOB_PHASE_RANKS = "training_job_phase:fleetscope_training_phase:count"
# When a job last made progress: its newest completed step, or before any, its newest phase change
# (ranks that said goodbye left out). On Prometheus's clock.
JOB_PROGRESS = "training_job:fleetscope_training_progress:timestamp_seconds"
# Jobs that pause (value 1): a rank in a phase of the job's own naming (a declared checkpoint), every rank in the
# same phase of its own work or between steps (a checkpoint, an evaluation), or a rank restarted and not yet
# through a step.
JOB_PAUSED = "training_job:fleetscope_training_phase:paused"
# How long a job may go without progress before it is hung: 10x its median step time, clamped; the pause
# threshold while it pauses (a declared phase, every rank in one phase outside a collective, a restart).
JOB_HANG_THRESHOLD = "training_job:fleetscope_training_progress:hang_threshold_seconds"
# Hung jobs only: those without progress for longer than their threshold (value: when they last made progress).
JOB_HUNG = "training_job:fleetscope_training_progress:hung"
# Ranks their peers wait for: outside a collective (label `phase` = data, compute or idle; value: when they
# entered it) for 2x the job's median step time and at least 15 s as of their node's last scrape, while most of
# the job's ranks wait in one.
# A job with such a rank is hung at once, whatever its threshold.
RANK_AWAITED = "rank:fleetscope_training_phase_start_timestamp_seconds:awaited_by_peers"
# The hang suspects: the awaited ranks, and in hung jobs the ranks not waiting in a collective (label `phase` =
# data, compute, other or idle; value: when they entered it) and those whose reports stopped
# (`phase="silent"`; value: their last report). Timestamps, not ages: a reader computes the age at its own
# evaluation.
RANK_HANG_SUSPECTS = "rank:fleetscope_training_phase_start_timestamp_seconds:hang_suspects"
# The few ranks the progress rules single out, recorded once so that every rule reads a handful of series
# instead of every rank's: ranks that said goodbye (value 1), ranks whose process is gone (value 0), ranks
# whose reports stopped (value: their last report), and per job its newest report.
RANK_ENDED = "rank:fleetscope_training_phase:ended"
# Every rank's current phase, one series a rank (label `phase`, value 1): the phase series read once a round.
RANK_PHASE = "rank:fleetscope_training_phase:current"
RANK_GONE = "rank:fleetscope_training_process_up:gone"
RANK_SILENT = "rank:fleetscope_training_last_push_timestamp_seconds:silent"
JOB_LAST_PUSH = "training_job:fleetscope_training_last_push_timestamp_seconds:max"
# Ranks that stopped (value 1): said goodbye, process gone, or no report for Settings.running_report_seconds; and
# per job its ranks that still run. A stopped rank keeps its frozen medians and counters for minutes: every
# straggler, pace and share rule leaves it out, and a job without running ranks raises none of their alerts
# (its stop is the hang and silence rules').
RANK_STOPPED = "rank:fleetscope_training_last_push_timestamp_seconds:stopped"
JOB_RUNNING_RANKS = "training_job:fleetscope_training_step_seconds_median:count_running"


def on_prometheus_clock(selector: str) -> str:
    """A node timestamp series (a selector) on Prometheus's clock: plus its node's :data:`NODE_CLOCK_OFFSET`.
    Binds as ``+``: parenthesise it under ``*`` or ``/``."""
    return f"{selector}\n  + on (instance) group_left ()\n{NODE_CLOCK_OFFSET}"


def rank_share(part: str) -> str:
    """:data:`RANK_DATA_SHARE` or :data:`RANK_COMM_SHARE` by phase name."""
    return {"data": RANK_DATA_SHARE, "comm": RANK_COMM_SHARE}[part]


def job_share(part: str) -> str:
    """:data:`JOB_DATA_SHARE` or :data:`JOB_COMM_SHARE` by phase name."""
    return {"data": JOB_DATA_SHARE, "comm": JOB_COMM_SHARE}[part]


# -- training: goodput --------------------------------------------------------------------------------

# A job's ranks that report steps, and its newest step's time: the per-job figures the goodput rules read
# (recorded once: reading 16k ranks' series is what costs at fleet size).
JOB_RANKS = "training_job:fleetscope_training_last_step_timestamp_seconds:count"
JOB_LAST_STEP = "training_job:fleetscope_training_last_step_timestamp_seconds:max"
# A job's median step time, its median over the sustain window, and the lowest of that in the best window.
JOB_STEP_SUSTAINED = "training_job:fleetscope_training_step_seconds_median:median_sustained"
JOB_STEP_BEST = "training_job:fleetscope_training_step_seconds_median:best_sustained"
# Stalled jobs only: no step for goodput_stall_multiple x the best sustained step time (value: the job's ranks).
JOB_STALLED = "training_job:fleetscope_training_last_step_timestamp_seconds:stalled"
# Best sustained step time over the current one (1 = at its best pace; 0 while stalled).
JOB_GOODPUT = "training_job:fleetscope_training_goodput:ratio"
# GPU-seconds lost per second against the best sustained step time: ranks x (1 - goodput).
JOB_LOST_VS_BEST = "training_job:fleetscope_training_lost_gpu_seconds:rate_vs_best"
# GPU-seconds lost per second, labelled `cause` (see GOODPUT_CAUSES).
JOB_LOST_GPU_SECONDS = "training_job:fleetscope_training_lost_gpu_seconds:rate"
GOODPUT_CAUSES: dict[str, str] = {
    "straggler_wait": "ranks waiting in collectives for a slower peer",
    "input_wait": "ranks waiting for their own input data",
    "hang": "no step for several best step times (hang, checkpoint, restart)",
    "silent_ranks": "ranks that stopped reporting while the others go on",
}

# -- training: repeat offenders -----------------------------------------------------------------------

# Flagged ranks per node and job.
NODE_JOB_STRAGGLERS = "instance_training_job:fleetscope_training_straggler:count"
# 1 while a node had a flagged rank within the repeat gap (flags closer than that are one window), else 0
# (for every scraped node, so the end of a window is a 1 -> 0 step even when the node then sits idle).
NODE_STRAGGLER_FLAGGED = "instance:fleetscope_training_straggler:flagged"
# Distinct jobs, and separate windows, in which a node's ranks were flagged within the repeat window.
NODE_STRAGGLER_JOBS = "instance:fleetscope_training_straggler:jobs"
NODE_STRAGGLER_WINDOWS = "instance:fleetscope_training_straggler:windows"


# -- GPU ----------------------------------------------------------------------------------------------

# Clock-event reasons that mean the GPU slowed itself down: not idle, not application clocks, not the power
# cap every busy GPU hits (a GPU capped harder than its peers shows as a low clock instead).
SLOWDOWN_REASONS = "hw_slowdown|hw_thermal|sw_thermal|hw_power_brake"
# The reasons the node dashboard shows the share of: the slowdowns (recorded) and the power cap beside them
# (read from its counter by the panel, for one node: every busy GPU hits it, so recording it for the fleet
# read 8 series per node a round that only that panel needed).
THROTTLE_SHARE_REASONS = f"{SLOWDOWN_REASONS}|sw_power_cap"
# Share of time a GPU's clocks were held down, per slowdown reason (SLOWDOWN_REASONS), where above 0.
GPU_THROTTLE_SHARE = "instance_gpu_reason:fleetscope_gpu_throttle_seconds:rate"
# A GPU's SM clock over the median SM clock of its node, for the GPUs below 0.9 of it only (the higher of the
# straggler cause's 0.9 and the alert's 0.85: every reader's GPUs are in it).
GPU_CLOCK_RATIO = "instance_gpu:fleetscope_gpu_clock_hertz:ratio_node_median"
# Mean GPU utilization of a node.
NODE_GPU_UTILIZATION = "instance:fleetscope_gpu_utilization_ratio:avg"
# How busy a GPU was over the window: SM activity where GPM reports it, else utilization.
GPU_BUSY = "instance_gpu:fleetscope_gpu_busy_ratio:avg_over_time"

# -- network ------------------------------------------------------------------------------------------

EFA_RATE_COUNTERS = ("retransmit_packets", "rx_bytes", "tx_bytes", "rx_drops")
TCP_RETRANSMIT_RATIO = "instance:fleetscope_tcp_retransmitted_segments_per_out_segments:ratio_rate"
# Packets per second an ENA interface had shaped by an EC2 allowance (label `allowance`: bw_in, bw_out, pps,
# conntrack, linklocal), where above 0: read once for the alert and the straggler cause.
ENA_ALLOWANCE_SHAPED = "instance_device:fleetscope_ena_allowance_exceeded:rate"


def efa_rate(counter: str) -> str:
    """A node's EFA counter rate, summed over its devices and ports (counter from :data:`EFA_RATE_COUNTERS`)."""
    if counter not in EFA_RATE_COUNTERS:
        raise KeyError(counter)
    return f"instance:fleetscope_efa_{counter}:rate"


def interface_ratio(what: str) -> str:
    """Errors or drops per packet of a network interface, labelled by ``direction``."""
    if what not in ("errors", "dropped"):
        raise KeyError(what)
    return f"instance_device:fleetscope_net_{what}_per_packets:ratio_rate"


# -- fleetscope itself (rules/selfmon.py) ----------------------------------------------------------------

# The circuit breaker of `fleetscope check` (fleetscope.check.verdicts): per cluster, how many nodes may carry one
# finding (the share of the nodes scraped within the breaker window, rounded up, one at least), and per finding
# (label `finding`) how many did within that window.
CLUSTER_BREAKER_ALLOWED = "cluster:fleetscope_breaker_nodes:allowed"
CLUSTER_BREAKER_CARRYING = "cluster:fleetscope_breaker_nodes:carrying"


# -- NCCL Inspector (rules/nccl.py) --------------------------------------------------------------------

# Per rank, communicator, collective and size bucket: mean execution time of one collective over the window.
NCCL_COLLECTIVE_MEAN = "comm_rank_collective:fleetscope_nccl_collective_seconds_per_collective:ratio_rate"
# Median over a communicator's reporting ranks (two or more) of that mean, per collective and size bucket.
NCCL_COMM_COLLECTIVE_MEDIAN = "comm_collective:fleetscope_nccl_collective_seconds_per_collective:median"
# A rank's collective time in a communicator over what the communicator's median rank spends on the same
# collectives (1.0 = typical; the rank that arrives last waits least, so it is lowest).
NCCL_RANK_COMM_RATIO = "comm_rank:fleetscope_nccl_collective_seconds:ratio_comm_median"
# What the median rank spends per second on those collectives minus what this rank spends: the share of
# its peers' time spent waiting for it (negative for a rank that waits for others).
NCCL_RANK_COMM_WAIT = "comm_rank:fleetscope_nccl_collective_seconds:rate_below_comm_median"
# Per rank over all its communicators: the highest ratio (below the threshold only when it is late in every
# communicator it is in, so a rank held up by a late peer in another group is not named) and the largest wait.
NCCL_RANK_RATIO = "rank:fleetscope_nccl_collective_seconds:max_ratio_comm_median"
NCCL_RANK_WAIT = "rank:fleetscope_nccl_collective_seconds:max_rate_below_comm_median"
# Bus bandwidth a communicator delivered per collective and size bucket: the best rank's (the last to arrive
# has no wait in its time), then over its own average an offset earlier, then per node the lowest such ratio
# of the communicators it has ranks in.
NCCL_COMM_BUS_BANDWIDTH = (
    "training_job_comm_collective:fleetscope_nccl_collective_bus_bytes_per_collective_seconds:max_ratio_rate")
NCCL_COMM_BUS_BANDWIDTH_BASELINE = (
    "training_job_comm_collective:fleetscope_nccl_collective_bus_bytes_per_collective_seconds:ratio_baseline")
NCCL_NODE_BUS_BANDWIDTH_BASELINE = (
    "instance_training_job:fleetscope_nccl_collective_bus_bytes_per_collective_seconds:min_ratio_baseline")

# -- shared expressions -------------------------------------------------------------------------------


def indent(text: str, by: str = "  ") -> str:
    """Indent every line after the first, for an expression nested in another."""
    return text.replace("\n", "\n" + by)


def silent_ranks(after: str) -> str:
    """Ranks whose last report is older than ``after`` seconds (:data:`RANK_SILENT`, recorded with the
    same ``after``) while another rank of the same job reported within it."""
    return (
        f"{RANK_SILENT}\n"
        f"and on (training_job)\n"
        f"(time() - {JOB_LAST_PUSH} < {after})"
    )


def on_gpu(expr: str) -> str:
    """``expr`` per rank with the rank's ``gpu`` label: one join with :data:`RANK_GPU`. ``expr`` must bind
    tighter than ``*`` (a name, a selector, a parenthesised expression)."""
    return f"{expr}\n  * on ({RANK_KEY}) group_left (gpu)\n{RANK_GPU}"


def recording_rule_names() -> frozenset[str]:
    """Every recording-rule name of the vocabulary: the module's ``level:metric:operations`` constants and
    the families built by functions. The rule files must record only these (a test checks it)."""
    constants = {
        value for name, value in globals().items()
        if name.isupper() and isinstance(value, str) and value.count(":") == 2
    }
    families = {efa_rate(c) for c in EFA_RATE_COUNTERS} | {interface_ratio(w) for w in ("errors", "dropped")}
    return frozenset(constants | families)
