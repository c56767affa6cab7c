"""TCP collector: node-wide TCP counters from procfs."""

from __future__ import annotations

from prometheus_client.core import Metric

from fleetscope.collectors.protocol import Collector
from fleetscope.config import Config
from fleetscope.errors import Incomplete
from fleetscope.metrics import netstat
from fleetscope.metrics.families import FamilyBuilder
from fleetscope.sources.fs import Root
from fleetscope.sources.netstat import NetstatReading, read_netstat


def netstat_families(reading: NetstatReading) -> list[Metric]:
    """Map a reading to metric families (pure: no file access); a field the kernel lacks stays absent."""
    builder = FamilyBuilder()
    for key, spec in netstat.TABLE.specs.items():
        builder.add(spec, (), reading.get(key))
    return builder.families()


class NetstatCollector(Collector):
    name = "netstat"
    tables = (netstat.TABLE,)

    def __init__(self, config: Config) -> None:
        self.procfs = Root(config.path.procfs)

    def collect(self) -> list[Metric]:
        reading = read_netstat(self.procfs)
        families = netstat_families(reading)
        if reading.missing:
            raise Incomplete("; ".join(reading.missing), families)
        return families
