"""The daemon's HTTP listeners: connections held and connections dropped to keep the node answering."""

from __future__ import annotations

from fleetscope.metrics.spec import MetricSpec, table

PREFIX = "fleetscope_http_"
_LISTENER = ("listener",)

CONNECTIONS = MetricSpec(
    "fleetscope_http_connections", "gauge",
    "Open connections on the listener (main: /metrics, probes and, unless separate, pushes; push: "
    "push.listen-address).", _LISTENER)
MAX_CONNECTIONS = MetricSpec(
    "fleetscope_http_max_connections", "gauge",
    "Connection cap of the listener: web.max-connections, lowered to fit the open files limit.", _LISTENER)
CONNECTIONS_DROPPED_TOTAL = MetricSpec(
    "fleetscope_http_connections_dropped_total", "counter",
    "Connections closed by the daemon: read_header_timeout and read_timeout (a client too slow to send its "
    "request, answered 408), evicted (the longest-waiting connection, closed for a new one at the cap), "
    "over_limit (a new connection refused with 503 because every other one was being answered).",
    ("listener", "reason"))

TABLE = table(
    "http",
    "The daemon's HTTP listeners: connections held and dropped (web.max-connections, web.read-header-timeout, "
    "web.read-timeout).",
    [
        ("connections", CONNECTIONS),
        ("max_connections", MAX_CONNECTIONS),
        ("dropped", CONNECTIONS_DROPPED_TOTAL),
    ],
)
