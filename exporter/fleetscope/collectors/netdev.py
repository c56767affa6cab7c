"""NIC collector: per-interface counters, state, speed and MTU, and the "physical link down" finding."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from fleetscope.collectors.protocol import Collector, Finding, HealthCheck
from fleetscope.config import Config
from fleetscope.errors import Incomplete, NoHardware, SourceError
from fleetscope.metrics import netdev
from fleetscope.metrics.families import FamilyBuilder
from fleetscope.sources.fs import Root
from fleetscope.sources.netdev import NetInterface, read_netdev


def netdev_families(interfaces: Iterable[NetInterface]) -> list[Metric]:
    """Map interfaces to metric families (pure: no file access)."""
    builder = FamilyBuilder()
    for interface in interfaces:
        labels = (interface.name,)
        for stat, spec in netdev.STATISTICS.items():
            builder.add(spec, labels, interface.stats.get(stat))
        builder.add(netdev.CARRIER_CHANGES_TOTAL, labels, interface.carrier_changes)
        if interface.operstate is not None:
            builder.add(netdev.UP, labels, 1 if interface.up else 0)
        builder.add(netdev.SPEED_BYTES_PER_SECOND, labels, interface.speed_mbps)
        builder.add(netdev.MTU_BYTES, labels, interface.mtu)
        builder.add_info(
            netdev.INFO,
            labels,
            {
                "operstate": interface.operstate or "",
                "address": interface.address,
                "driver": interface.driver,
            },
        )
    return builder.families()


def netdev_findings(interfaces: Iterable[NetInterface]) -> list[Finding]:
    """A physical interface that is reported (not excluded) but not up is unhealthy."""
    return [
        Finding(
            "netdev",
            "unhealthy",
            f"nic {i.name}",
            f"physical interface is {i.operstate or 'in an unknown state'}",
        )
        for i in interfaces
        if i.physical and not i.up
    ]


class NetdevCollector(Collector, HealthCheck):
    name = "netdev"
    tables = (netdev.TABLE,)

    def __init__(self, config: Config) -> None:
        self.sysfs = Root(config.path.sysfs)
        self.include = config.net.device_include
        self.exclude = config.net.device_exclude

    def _read(self) -> tuple[NetInterface, ...]:
        interfaces = read_netdev(self.sysfs, self.include, self.exclude)
        if not interfaces and not self.sysfs.listdir("class", "net"):
            # A node always has interfaces (lo at least): none at all means sysfs is not where it should be.
            raise SourceError(f"no network interface under {self.sysfs.path('class', 'net')} (--path.sysfs?)")
        return interfaces

    def collect(self) -> list[Metric]:
        interfaces = self._read()
        if not interfaces:
            raise NoHardware("no network interfaces selected under class/net")
        families = netdev_families(interfaces)
        blind = [i.name for i in interfaces if not i.stats]
        if blind:
            message = f"no statistics readable for {len(blind)} of {len(interfaces)} interfaces: {', '.join(blind)}"
            if len(blind) == len(interfaces):
                raise SourceError(message)
            raise Incomplete(message, families)
        return families

    def health(self) -> list[Finding]:
        return netdev_findings(self._read())
