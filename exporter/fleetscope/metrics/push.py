"""The push receiver's own counts (``POST /api/v1/steps`` and Pushgateway-style groups)."""

from __future__ import annotations

from fleetscope.metrics.spec import MetricSpec, table

PREFIX = "fleetscope_push_"

RECORDS_TOTAL = MetricSpec("fleetscope_push_records_total", "counter", "Step records stored.")
REJECTED_TOTAL = MetricSpec(
    "fleetscope_push_rejected_total", "counter",
    "Pushes refused, by reason (invalid, too_large, limit, unauthorized, incomplete: the body did not "
    "arrive whole, busy: push.max-inflight-bytes were in flight, reserved: a metric or label name Prometheus "
    "or fleetscope give meaning to, lease: a live rank's steps, phase or job from another process), and parts "
    "of accepted pushes refused: "
    "duplicate (a step the rank's tracker had sent and the daemon stored before: a re-send, not an error), "
    "clock (a completion time in the future or before the previous one, replaced by the time the daemon "
    "received it).", ("reason",))
JOBS = MetricSpec("fleetscope_push_jobs", "gauge", "Training jobs with at least one live rank.")
RANKS = MetricSpec("fleetscope_push_ranks", "gauge", "Ranks whose series are live.")
EXPIRED_TOTAL = MetricSpec(
    "fleetscope_push_expired_total", "counter",
    "Ranks (kind=rank) and Pushgateway-style groups (kind=group) dropped for lack of pushes.", ("kind",))
GROUPS = MetricSpec("fleetscope_push_groups", "gauge", "Pushgateway-style groups held.")
GROUP_SAMPLES = MetricSpec(
    "fleetscope_push_group_samples", "gauge",
    "Samples held in Pushgateway-style groups, all together (push.max-samples bounds them).")
GROUP_BYTES = MetricSpec(
    "fleetscope_push_group_bytes", "gauge",
    "Bytes Pushgateway-style groups add to the text exposition, all together, grouping labels counted on every "
    "sample (push.max-bytes bounds them).", unit="bytes")
# The labels are the group's grouping key, which varies by group: training_job is the one always there.
GROUP_LAST_PUSH_TIMESTAMP_SECONDS = MetricSpec(
    "fleetscope_push_group_last_push_timestamp_seconds", "gauge",
    "Unix time of the last push to a Pushgateway-style group; labels are the group's grouping key "
    "(job exposed as training_job).",
    ("training_job",), unit="seconds")
# The clock every Unix time the steps collector exports is on (docs/reliability.md, clock steps).
SCRAPE_TIMESTAMP_SECONDS = MetricSpec(
    "fleetscope_push_scrape_timestamp_seconds", "gauge",
    "The node's wall clock (Unix time) when this scrape read the pushed steps and groups: every "
    "fleetscope_training_*_timestamp_seconds and group last-push time of the scrape is on this reading. "
    "Prometheus's sample time minus it is the node clock's offset from Prometheus's clock.",
    unit="seconds")

TABLE = table(
    "push",
    "The push receiver's own counts (POST /api/v1/steps and Pushgateway-style groups).",
    [
        ("records", RECORDS_TOTAL),
        ("rejected", REJECTED_TOTAL),
        ("jobs", JOBS),
        ("ranks", RANKS),
        ("expired", EXPIRED_TOTAL),
        ("groups", GROUPS),
        ("group_samples", GROUP_SAMPLES),
        ("group_bytes", GROUP_BYTES),
        ("group_last_push", GROUP_LAST_PUSH_TIMESTAMP_SECONDS),
        ("scrape_time", SCRAPE_TIMESTAMP_SECONDS),
    ],
    collector="steps",
)
