"""The daemon's report on its own collectors, and its build."""

from __future__ import annotations

from fleetscope.metrics.spec import MetricSpec, table

PREFIX = "fleetscope_"
_COLLECTOR = ("collector",)

COLLECTOR_SUCCESS = MetricSpec(
    "fleetscope_collector_success", "gauge",
    "1 if the collector's last attempt succeeded (no hardware counts as success), 0 if it failed or timed out.",
    _COLLECTOR)
COLLECTOR_DURATION_SECONDS = MetricSpec(
    "fleetscope_collector_duration_seconds", "gauge",
    "Duration of the collector's last attempt (time so far, if it is still running past its timeout).",
    _COLLECTOR, unit="seconds")
COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS = MetricSpec(
    "fleetscope_collector_last_success_timestamp_seconds", "gauge",
    "Unix time of the collector's last successful attempt.", _COLLECTOR, unit="seconds")
COLLECTOR_HARDWARE_PRESENT = MetricSpec(
    "fleetscope_collector_hardware_present", "gauge",
    "1 if the collector found its hardware on this node, 0 if the hardware is absent.", _COLLECTOR)
BUILD_INFO = MetricSpec(
    "fleetscope_build_info", "info", "fleetscope version and Python runtime.", (),
    info_keys=("version", "python"))

TABLE = table(
    "engine",
    "The daemon's report on its own collectors.",
    [
        ("success", COLLECTOR_SUCCESS),
        ("duration", COLLECTOR_DURATION_SECONDS),
        ("last_success", COLLECTOR_LAST_SUCCESS_TIMESTAMP_SECONDS),
        ("hardware_present", COLLECTOR_HARDWARE_PRESENT),
        ("build", BUILD_INFO),
    ],
)
