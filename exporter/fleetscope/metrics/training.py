"""Per-rank training series, from the steps and positions each rank pushes (``POST /api/v1/report``,
``POST /api/v1/steps``).

:data:`TABLE` is keyed by the value each metric is read from: a step field of
:mod:`fleetscope.wire` (summed, or the newest), its rolling median
(``<field>_median``), or the receiver's own ``steps`` and ``last_push``
(:func:`fleetscope.wire.value_keys`). :data:`POSITION_TABLE` holds where
each rank is now.
"""

from __future__ import annotations

from fleetscope.metrics.spec import MetricKind, MetricSpec, table

PREFIX = "fleetscope_training_"
RANK_LABELS = ("training_job", "rank", "local_rank", "pp_stage")


def _rank(name: str, kind: MetricKind, help: str, raw: str, unit: str = "") -> MetricSpec:
    return MetricSpec(name, kind, help, RANK_LABELS, unit=unit, raw=raw)


STEPS_TOTAL = _rank("fleetscope_training_steps_total", "counter", "Steps the rank has reported.", "steps")
STEP_SECONDS_TOTAL = _rank(
    "fleetscope_training_step_seconds_total", "counter",
    "Wall time of the reported steps (on a GPU the device's, from one step's end to the next's).", "step_seconds",
    "seconds")
DATA_SECONDS_TOTAL = _rank(
    "fleetscope_training_data_seconds_total", "counter",
    "Time the rank waited for input data: on a GPU the device's idle time while the host fetched the batch, "
    "elsewhere the host's fetch time.", "data_seconds", "seconds")
FETCH_SECONDS_TOTAL = _rank(
    "fleetscope_training_fetch_seconds_total", "counter",
    "Host time the rank's training loop spent fetching input (the loader's latency), whatever the device did "
    "meanwhile.", "fetch_seconds", "seconds")
COMPUTE_SECONDS_TOTAL = _rank(
    "fleetscope_training_compute_seconds_total", "counter",
    "The rank's own work (forward, backward, optimizer), excluding collective waits.", "compute_seconds",
    "seconds")
COMM_SECONDS_TOTAL = _rank(
    "fleetscope_training_comm_seconds_total", "counter", "Exposed wait in collective communication.",
    "comm_seconds", "seconds")
TOKENS_TOTAL = _rank("fleetscope_training_tokens_total", "counter", "Tokens the rank processed.", "tokens")
SAMPLES_TOTAL = _rank("fleetscope_training_samples_total", "counter", "Samples the rank processed.", "samples")
LAST_STEP = _rank(
    "fleetscope_training_last_step", "gauge", "Step number of the rank's newest record.", "step")
LAST_STEP_TIMESTAMP_SECONDS = _rank(
    "fleetscope_training_last_step_timestamp_seconds", "gauge",
    "Unix time the rank's newest reported step completed.", "timestamp", "seconds")
LAST_PUSH_TIMESTAMP_SECONDS = _rank(
    "fleetscope_training_last_push_timestamp_seconds", "gauge",
    "Unix time the daemon last received a push from the rank.", "last_push", "seconds")
LOSS = _rank("fleetscope_training_loss", "gauge", "Loss of the rank's newest step that reported one.", "loss")
STEP_SECONDS_MEDIAN = _rank(
    "fleetscope_training_step_seconds_median", "gauge",
    "Median step wall time over the rank's last push.median-window steps.", "step_seconds_median", "seconds")
DATA_SECONDS_MEDIAN = _rank(
    "fleetscope_training_data_seconds_median", "gauge",
    "Median data wait over the rank's last push.median-window steps that reported it.", "data_seconds_median",
    "seconds")
FETCH_SECONDS_MEDIAN = _rank(
    "fleetscope_training_fetch_seconds_median", "gauge",
    "Median host fetch time (the loader's latency) over the rank's last push.median-window steps that reported it.",
    "fetch_seconds_median", "seconds")
COMPUTE_SECONDS_MEDIAN = _rank(
    "fleetscope_training_compute_seconds_median", "gauge",
    "Median compute time over the rank's last push.median-window steps that reported it.", "compute_seconds_median",
    "seconds")
COMM_SECONDS_MEDIAN = _rank(
    "fleetscope_training_comm_seconds_median", "gauge",
    "Median exposed communication wait over the rank's last push.median-window steps that reported it.",
    "comm_seconds_median", "seconds")
RANK_INFO = MetricSpec(
    "fleetscope_training_rank_info", "info", "Placement of a rank as it last reported it.", RANK_LABELS,
    info_keys=("dp_rank", "world_size", "gpu"))

# Where a rank is now (its position, reported at least once a second while the process lives).
PHASE = MetricSpec(
    "fleetscope_training_phase", "gauge",
    "1 for the phase the rank is in now, 0 for the others: data (waiting for input), compute (its own work), "
    "comm (waiting in a collective), other (a phase of the user's naming), idle (between steps), ended (the "
    "process said goodbye).",
    (*RANK_LABELS, "phase"), raw="phase")
PHASE_START_TIMESTAMP_SECONDS = _rank(
    "fleetscope_training_phase_start_timestamp_seconds", "gauge",
    "Unix time the rank entered the phase it is in now.", "since", "seconds")
CURRENT_STEP = _rank(
    "fleetscope_training_current_step", "gauge", "Step the rank is in now (the next one when between steps).",
    "step")
PROCESS_UP = _rank(
    "fleetscope_training_process_up", "gauge",
    "1 while the node's daemon sees the rank's process, 0 once it is gone without saying goodbye (it died); "
    "absent when the daemon cannot see it (another PID namespace without hostPID) and after the goodbye.",
    "pid")

TABLE = table(
    "steps",
    "Training steps pushed by each rank (POST /api/v1/report, or flat records to POST /api/v1/steps); series "
    "expire after push.rank-ttl without pushes (5 minutes once the rank said goodbye).",
    [
        *((spec.raw, spec) for spec in (
            STEPS_TOTAL, STEP_SECONDS_TOTAL, DATA_SECONDS_TOTAL, FETCH_SECONDS_TOTAL, COMPUTE_SECONDS_TOTAL,
            COMM_SECONDS_TOTAL, TOKENS_TOTAL, SAMPLES_TOTAL, LAST_STEP, LAST_STEP_TIMESTAMP_SECONDS,
            LAST_PUSH_TIMESTAMP_SECONDS, LOSS, STEP_SECONDS_MEDIAN, DATA_SECONDS_MEDIAN, FETCH_SECONDS_MEDIAN,
            COMPUTE_SECONDS_MEDIAN, COMM_SECONDS_MEDIAN,
        )),
        ("rank_info", RANK_INFO),
    ],
)

POSITION_TABLE = table(
    "positions",
    "Where each rank is now, from the position fleetscope.client reports at least once a second (POST "
    "/api/v1/report) while the process lives; gone with the rank's other series.",
    [("phase", PHASE), ("since", PHASE_START_TIMESTAMP_SECONDS), ("step", CURRENT_STEP), ("pid", PROCESS_UP)],
    collector="steps",
)
