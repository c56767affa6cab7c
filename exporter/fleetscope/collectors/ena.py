"""ENA collector: AWS network allowance and driver reset counters from ``ethtool -S``.

The ENA driver reports, per interface, how many packets the instance's
network allowances shaped (queued or dropped), how many more connections the
connection-tracking allowance admits, and its own reset and timeout totals.
The statistics are read through :mod:`fleetscope.sources.ethtool`; only the
names in :data:`ENA_TABLE` are exported (per-queue statistics are left out:
tens of series per queue and nothing a rule needs).
"""

from __future__ import annotations

from typing import Callable

from prometheus_client.core import Metric

from fleetscope.config import Config
from fleetscope.errors import NoHardware, SourceError
from fleetscope.families import FamilyBuilder
from fleetscope.health import Finding
from fleetscope.sources.ethtool import EthtoolReading, read_with_socket
from fleetscope.sources.fs import Root
from fleetscope.spec import MetricSpec, table

ENA_DRIVERS = frozenset({"ena"})
_DEVICE = ("device",)
_REASON = ("device", "reason")


def _allowance(raw: str, what: str) -> tuple[str, MetricSpec]:
    return raw, MetricSpec(
        f"fleetscope_ena_{raw}_total", "counter",
        f"Packets queued or dropped because the instance exceeded its {what} (ethtool {raw}).",
        _DEVICE, unit="packets", raw=raw,
    )


def _reset_reason(raw: str) -> tuple[str, MetricSpec]:
    return raw, MetricSpec(
        "fleetscope_ena_reset_reasons_total", "counter",
        "ENA device resets the driver triggered, by reason (ethtool name of the reason counter; "
        "newer drivers only).", _REASON, raw=raw,
    )


ENA_TABLE = table(
    "ena",
    "ENA driver statistics per interface, read with the SIOCETHTOOL ioctl (the values `ethtool -S` "
    "shows). Allowance counters need driver 2.2.10+, `conntrack_allowance_available` needs the "
    "device's customer-metrics capability (driver 2.8.1+); absent on older drivers, never 0.",
    [
        _allowance("bw_in_allowance_exceeded", "inbound aggregate bandwidth allowance"),
        _allowance("bw_out_allowance_exceeded", "outbound aggregate bandwidth allowance"),
        _allowance("pps_allowance_exceeded", "bidirectional packets-per-second allowance"),
        _allowance("conntrack_allowance_exceeded", "connection-tracking allowance (new connections fail)"),
        _allowance("linklocal_allowance_exceeded", "link-local packet-rate allowance (DNS, IMDS, time sync)"),
        ("conntrack_allowance_available", MetricSpec(
            "fleetscope_ena_conntrack_allowance_available", "gauge",
            "Tracked connections that can still be established before the connection-tracking "
            "allowance is reached.",
            _DEVICE, unit="connections", raw="conntrack_allowance_available")),
        ("tx_timeout", MetricSpec(
            "fleetscope_ena_tx_timeouts_total", "counter",
            "Transmit queue timeouts reported by the kernel's netdev watchdog to the ENA driver.",
            _DEVICE, raw="tx_timeout")),
        ("total_resets", MetricSpec(
            "fleetscope_ena_resets_total", "counter", "ENA device resets performed by the driver.",
            _DEVICE, raw="total_resets")),
        ("reset_fail", MetricSpec(
            "fleetscope_ena_reset_failures_total", "counter",
            "ENA device resets that failed (the interface stays down until the driver recovers it).",
            _DEVICE, raw="reset_fail")),
        ("wd_expired", MetricSpec(
            "fleetscope_ena_keep_alive_timeouts_total", "counter",
            "Times the driver's keep-alive watchdog expired because the device sent no keep-alive event.",
            _DEVICE, raw="wd_expired")),
        _reset_reason("missing_tx_cmpl"),
        _reset_reason("missing_intr"),
        _reset_reason("missing_first_intr"),
        _reset_reason("suspected_poll_starvation"),
        _reset_reason("bad_tx_req_id"),
        _reset_reason("bad_rx_req_id"),
        _reset_reason("bad_rx_desc_num"),
        _reset_reason("rx_desc_malformed"),
        _reset_reason("tx_desc_malformed"),
        _reset_reason("invalid_state"),
        _reset_reason("os_netdev_wd"),
        _reset_reason("missing_admin_interrupt"),
        _reset_reason("admin_to"),
        _reset_reason("device_request_reset"),
    ],
)

EnaReader = Callable[[], EthtoolReading]


class EnaCollector:
    name = "ena"
    tables = (ENA_TABLE,)

    def __init__(self, config: Config, reader: EnaReader | None = None) -> None:
        self._config = config
        self._reader = reader if reader is not None else self._read_host

    def _read_host(self) -> EthtoolReading:
        net = self._config.net
        root = Root(self._config.path.sysfs)
        return read_with_socket(root, ENA_DRIVERS, net.device_include, net.device_exclude)

    def read(self) -> EthtoolReading:
        """Statistics of every selected ENA interface; :class:`NoHardware` when there is none."""
        reading = self._reader()
        if reading.found == 0:
            raise NoHardware("no ENA network interface")
        return reading

    def collect(self) -> list[Metric]:
        reading = self.read()
        if not reading.interfaces:
            # Every ENA interface refused: that is a failed collection, not an empty one.
            reasons = "; ".join(f"{bad.device}: {bad.reason}" for bad in reading.unreadable)
            raise SourceError(f"no ENA interface could be read ({reasons})")
        builder = FamilyBuilder()
        for interface in reading.interfaces:
            for raw, value in interface.stats.items():
                spec = ENA_TABLE.get(raw)
                if spec is None:
                    continue
                labels = (interface.device, raw) if spec.labels == _REASON else (interface.device,)
                builder.add(spec, labels, value)
        return builder.families()

    def health(self) -> list[Finding]:
        # Allowance counters only mean something as deltas, which one reading cannot give;
        # what a single check can tell is whether every ENA interface answers at all.
        reading = self.read()
        return [
            Finding(self.name, "unknown", f"ena {bad.device}", f"statistics unreadable: {bad.reason}")
            for bad in reading.unreadable
        ]
