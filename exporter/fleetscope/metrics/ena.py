"""ENA driver statistics (``ethtool -S``): network allowances, resets and their reasons, keyed by statistic name.

Per-queue statistics have no spec: tens of series per queue and nothing a rule needs.
"""

from __future__ import annotations

from fleetscope.metrics.spec import MetricSpec, table

PREFIX = "fleetscope_ena_"
_DEVICE = ("device",)


def _allowance(raw: str, what: str) -> MetricSpec:
    return MetricSpec(
        f"fleetscope_ena_{raw}_total", "counter",
        f"Packets queued or dropped because the instance exceeded its {what} (ethtool {raw}).",
        _DEVICE, unit="packets", raw=raw,
    )


BW_IN_ALLOWANCE_EXCEEDED_TOTAL = _allowance("bw_in_allowance_exceeded", "inbound aggregate bandwidth allowance")
BW_OUT_ALLOWANCE_EXCEEDED_TOTAL = _allowance(
    "bw_out_allowance_exceeded", "outbound aggregate bandwidth allowance")
PPS_ALLOWANCE_EXCEEDED_TOTAL = _allowance(
    "pps_allowance_exceeded", "bidirectional packets-per-second allowance")
CONNTRACK_ALLOWANCE_EXCEEDED_TOTAL = _allowance(
    "conntrack_allowance_exceeded", "connection-tracking allowance (new connections fail)")
LINKLOCAL_ALLOWANCE_EXCEEDED_TOTAL = _allowance(
    "linklocal_allowance_exceeded", "link-local packet-rate allowance (DNS, IMDS, time sync)")
CONNTRACK_ALLOWANCE_AVAILABLE = MetricSpec(
    "fleetscope_ena_conntrack_allowance_available", "gauge",
    "Tracked connections that can still be established before the connection-tracking allowance is reached.",
    _DEVICE, unit="connections", raw="conntrack_allowance_available")
TX_TIMEOUTS_TOTAL = MetricSpec(
    "fleetscope_ena_tx_timeouts_total", "counter",
    "Transmit queue timeouts reported by the kernel's netdev watchdog to the ENA driver.",
    _DEVICE, raw="tx_timeout")
RESETS_TOTAL = MetricSpec(
    "fleetscope_ena_resets_total", "counter", "ENA device resets performed by the driver.",
    _DEVICE, raw="total_resets")
RESET_FAILURES_TOTAL = MetricSpec(
    "fleetscope_ena_reset_failures_total", "counter",
    "ENA device resets that failed (the interface stays down until the driver recovers it).",
    _DEVICE, raw="reset_fail")
KEEP_ALIVE_TIMEOUTS_TOTAL = MetricSpec(
    "fleetscope_ena_keep_alive_timeouts_total", "counter",
    "Times the driver's keep-alive watchdog expired because the device sent no keep-alive event.",
    _DEVICE, raw="wd_expired")
# One family fed by one statistic per reason; the statistic's name is the reason label.
RESET_REASONS_TOTAL = MetricSpec(
    "fleetscope_ena_reset_reasons_total", "counter",
    "ENA device resets the driver triggered, by reason (ethtool name of the reason counter; newer drivers only).",
    ("device", "reason"), raw="<reason>")
RESET_REASONS = (
    "missing_tx_cmpl", "missing_intr", "missing_first_intr", "suspected_poll_starvation", "bad_tx_req_id",
    "bad_rx_req_id", "bad_rx_desc_num", "rx_desc_malformed", "tx_desc_malformed", "invalid_state", "os_netdev_wd",
    "missing_admin_interrupt", "admin_to", "device_request_reset",
)

TABLE = table(
    "ena",
    "ENA driver statistics per interface, read with the SIOCETHTOOL ioctl (the values `ethtool -S` "
    "shows). Allowance counters need driver 2.2.10+, `conntrack_allowance_available` needs the "
    "device's customer-metrics capability (driver 2.8.1+); absent on older drivers, never 0.",
    [
        *((spec.raw, spec) for spec in (
            BW_IN_ALLOWANCE_EXCEEDED_TOTAL, BW_OUT_ALLOWANCE_EXCEEDED_TOTAL, PPS_ALLOWANCE_EXCEEDED_TOTAL,
            CONNTRACK_ALLOWANCE_EXCEEDED_TOTAL, LINKLOCAL_ALLOWANCE_EXCEEDED_TOTAL, CONNTRACK_ALLOWANCE_AVAILABLE,
            TX_TIMEOUTS_TOTAL, RESETS_TOTAL, RESET_FAILURES_TOTAL, KEEP_ALIVE_TIMEOUTS_TOTAL,
        )),
        *((reason, RESET_REASONS_TOTAL.from_raw(reason)) for reason in RESET_REASONS),
    ],
)
