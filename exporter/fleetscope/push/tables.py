"""Metric tables of the push path: per-rank training series and the receiver's own counts."""

from __future__ import annotations

from fleetscope.spec import MetricSpec, table

RANK_LABELS = ("training_job", "rank", "local_rank", "pp_stage")


def _rank(name: str, kind: str, help: str, raw: str, unit: str = "") -> tuple[str, MetricSpec]:
    return raw, MetricSpec(name, kind, help, RANK_LABELS, unit=unit, raw=raw)  # type: ignore[arg-type]


STEPS_TABLE = table(
    "steps",
    "Training steps pushed by each rank to POST /api/v1/steps; series expire after push.rank-ttl "
    "without pushes.",
    [
        _rank("fleetscope_training_steps_total", "counter", "Steps the rank has reported.", "step"),
        _rank(
            "fleetscope_training_step_seconds_total",
            "counter",
            "Wall time of the reported steps.",
            "step_seconds",
            "seconds",
        ),
        _rank(
            "fleetscope_training_data_seconds_total",
            "counter",
            "Time the rank waited for input data.",
            "data_seconds",
            "seconds",
        ),
        _rank(
            "fleetscope_training_compute_seconds_total",
            "counter",
            "The rank's own work (forward, backward, optimizer), excluding collective waits.",
            "compute_seconds",
            "seconds",
        ),
        _rank(
            "fleetscope_training_comm_seconds_total",
            "counter",
            "Exposed wait in collective communication.",
            "comm_seconds",
            "seconds",
        ),
        _rank("fleetscope_training_tokens_total", "counter", "Tokens the rank processed.", "tokens"),
        _rank("fleetscope_training_samples_total", "counter", "Samples the rank processed.", "samples"),
        _rank(
            "fleetscope_training_last_step", "gauge", "Step number of the rank's newest record.", "last_step"
        ),
        _rank(
            "fleetscope_training_last_step_timestamp_seconds",
            "gauge",
            "Unix time the rank's newest reported step completed.",
            "timestamp",
            "seconds",
        ),
        _rank(
            "fleetscope_training_last_push_timestamp_seconds",
            "gauge",
            "Unix time the daemon last received a push from the rank.",
            "last_push",
            "seconds",
        ),
        _rank(
            "fleetscope_training_loss", "gauge", "Loss of the rank's newest step that reported one.", "loss"
        ),
        _rank(
            "fleetscope_training_step_seconds_median",
            "gauge",
            "Median step wall time over the rank's last push.median-window steps.",
            "step_median",
            "seconds",
        ),
        _rank(
            "fleetscope_training_data_seconds_median",
            "gauge",
            "Median data wait over the rank's last push.median-window steps that reported it.",
            "data_median",
            "seconds",
        ),
        _rank(
            "fleetscope_training_compute_seconds_median",
            "gauge",
            "Median compute time over the rank's last push.median-window steps that reported it.",
            "compute_median",
            "seconds",
        ),
        _rank(
            "fleetscope_training_comm_seconds_median",
            "gauge",
            "Median exposed communication wait over the rank's last push.median-window steps "
            "that reported it.",
            "comm_median",
            "seconds",
        ),
        (
            "rank_info",
            MetricSpec(
                "fleetscope_training_rank_info",
                "info",
                "Placement of a rank as it last reported it.",
                RANK_LABELS,
                info_keys=("dp_rank", "world_size", "gpu"),
            ),
        ),
    ],
)

PUSH_TABLE = table(
    "push",
    "The push receiver's own counts (POST /api/v1/steps and Pushgateway-style groups).",
    [
        ("records", MetricSpec("fleetscope_push_records_total", "counter", "Step records stored.")),
        (
            "rejected",
            MetricSpec(
                "fleetscope_push_rejected_total",
                "counter",
                "Pushes refused, by reason (invalid, too_large, limit, unauthorized).",
                ("reason",),
            ),
        ),
        ("jobs", MetricSpec("fleetscope_push_jobs", "gauge", "Training jobs with at least one live rank.")),
        ("ranks", MetricSpec("fleetscope_push_ranks", "gauge", "Ranks whose series are live.")),
        (
            "expired",
            MetricSpec(
                "fleetscope_push_expired_total",
                "counter",
                "Ranks (kind=rank) and Pushgateway-style groups (kind=group) dropped for lack of pushes.",
                ("kind",),
            ),
        ),
        ("groups", MetricSpec("fleetscope_push_groups", "gauge", "Pushgateway-style groups held.")),
        (
            "group_last_push",
            MetricSpec(
                "fleetscope_push_group_last_push_timestamp_seconds",
                "gauge",
                "Unix time of the last push to a Pushgateway-style group; labels are the group's "
                "grouping key "
                "(job exposed as training_job).",
                ("training_job",),
                unit="seconds",
            ),
        ),
    ],
)
