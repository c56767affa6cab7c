"""Network interfaces: kernel statistics, link state, speed and MTU (``/sys/class/net/<device>/``).

Statistics are keyed by their file in ``statistics/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from fleetscope.metrics.spec import MetricSpec, table

PREFIX = "fleetscope_net_"
_DEVICE = ("device",)


def _stat(raw: str, name: str, help: str, unit: str = "") -> MetricSpec:
    return MetricSpec(name, "counter", help, _DEVICE, unit=unit, raw=f"statistics/{raw}")


RECEIVE_BYTES_TOTAL = _stat("rx_bytes", "fleetscope_net_receive_bytes_total", "Bytes received.", "bytes")
RECEIVE_PACKETS_TOTAL = _stat("rx_packets", "fleetscope_net_receive_packets_total", "Packets received.")
RECEIVE_ERRORS_TOTAL = _stat(
    "rx_errors", "fleetscope_net_receive_errors_total", "Receive errors (all kinds).")
RECEIVE_DROPPED_TOTAL = _stat(
    "rx_dropped", "fleetscope_net_receive_dropped_total",
    "Received packets dropped by the stack (no buffer, unknown protocol, filtered).")
RECEIVE_MISSED_TOTAL = _stat(
    "rx_missed_errors", "fleetscope_net_receive_missed_total",
    "Packets the NIC missed because its receive ring was full (host too slow).")
TRANSMIT_BYTES_TOTAL = _stat("tx_bytes", "fleetscope_net_transmit_bytes_total", "Bytes transmitted.", "bytes")
TRANSMIT_PACKETS_TOTAL = _stat("tx_packets", "fleetscope_net_transmit_packets_total", "Packets transmitted.")
TRANSMIT_ERRORS_TOTAL = _stat(
    "tx_errors", "fleetscope_net_transmit_errors_total", "Transmit errors (all kinds).")
TRANSMIT_DROPPED_TOTAL = _stat(
    "tx_dropped", "fleetscope_net_transmit_dropped_total", "Packets dropped on transmit.")
CARRIER_CHANGES_TOTAL = MetricSpec(
    "fleetscope_net_carrier_changes_total", "counter", "Times the link went up or down.", _DEVICE,
    raw="carrier_changes")
UP = MetricSpec(
    "fleetscope_net_up", "gauge", "1 if the interface's operstate is up, 0 otherwise.", _DEVICE, raw="operstate")
SPEED_BYTES_PER_SECOND = MetricSpec(
    "fleetscope_net_speed_bytes_per_second", "gauge", "Link speed (absent when the driver does not report one).",
    _DEVICE, unit="bytes/second", raw="speed", scale=1e6 / 8)
MTU_BYTES = MetricSpec("fleetscope_net_mtu_bytes", "gauge", "MTU of the interface.", _DEVICE, unit="bytes", raw="mtu")
INFO = MetricSpec(
    "fleetscope_net_info", "info", "One interface: its state, hardware address and driver.", _DEVICE,
    info_keys=("operstate", "address", "driver"))

# statistics/ file -> its metric
STATISTICS: Mapping[str, MetricSpec] = MappingProxyType({
    spec.raw.removeprefix("statistics/"): spec
    for spec in (
        RECEIVE_BYTES_TOTAL, RECEIVE_PACKETS_TOTAL, RECEIVE_ERRORS_TOTAL, RECEIVE_DROPPED_TOTAL,
        RECEIVE_MISSED_TOTAL, TRANSMIT_BYTES_TOTAL, TRANSMIT_PACKETS_TOTAL, TRANSMIT_ERRORS_TOTAL,
        TRANSMIT_DROPPED_TOTAL,
    )
})

TABLE = table(
    "netdev",
    "Network interfaces from `/sys/class/net/<device>/`. Interfaces matching `net.device-exclude` "
    "(container-side virtual interfaces by default) are not reported.",
    [
        *STATISTICS.items(),
        ("carrier_changes", CARRIER_CHANGES_TOTAL),
        ("up", UP),
        ("speed", SPEED_BYTES_PER_SECOND),
        ("mtu", MTU_BYTES),
        ("info", INFO),
    ],
)
