"""ENA collector: AWS network allowance and driver reset counters from ``ethtool -S``.

The ENA driver reports, per interface, how many packets the instance's
network allowances shaped (queued or dropped), how many more connections the
connection-tracking allowance admits, and its own reset and timeout totals.
The statistics are read through :mod:`fleetscope.sources.ethtool`; only the
statistics :data:`fleetscope.metrics.ena.TABLE` names are exported (per-queue
statistics are left out: tens of series per queue and nothing a rule needs).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import Metric

from fleetscope.collectors.protocol import Collector, Finding, HealthCheck
from fleetscope.config import Config
from fleetscope.errors import Incomplete, NoHardware, SourceError
from fleetscope.metrics import ena
from fleetscope.metrics.families import FamilyBuilder
from fleetscope.sources.ethtool import EthtoolReading, read_with_socket
from fleetscope.sources.fs import Root

ENA_DRIVERS = frozenset({"ena"})

EnaReader = Callable[[], EthtoolReading]


class EnaCollector(Collector, HealthCheck):
    name = "ena"
    tables = (ena.TABLE,)

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
        blind: list[str] = [f"{bad.device}: {bad.reason}" for bad in reading.unreadable]
        for interface in reading.interfaces:
            known = 0
            for raw, value in interface.stats.items():
                spec = ena.TABLE.get(raw)
                if spec is None:
                    continue
                labels = (interface.device, raw) if spec.name == ena.RESET_REASONS_TOTAL.name else (interface.device,)
                builder.add(spec, labels, value)
                known += 1
            if not known:
                blind.append(f"{interface.device}: none of the ENA statistics fleetscope exports")
        families = builder.families()
        if blind:
            message = f"{len(blind)} of {reading.found} ENA interfaces yield no statistics: " + "; ".join(blind)
            if len(blind) == reading.found:
                raise SourceError(message)
            raise Incomplete(message, families)
        return families

    def health(self) -> list[Finding]:
        # Allowance counters only mean something as deltas, which one reading cannot give;
        # what a single check can tell is whether every ENA interface answers at all.
        reading = self.read()
        return [
            Finding(self.name, "unknown", f"ena {bad.device}", f"statistics unreadable: {bad.reason}")
            for bad in reading.unreadable
        ]
