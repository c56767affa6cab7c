"""EFA collector: per-port and per-device counters of every EFA device, and its health findings.

Counter files are classified here, once, through :data:`fleetscope.metrics.efa.TABLE`:
a curated counter gets its own metric, any other file the generic
``*_hw_stat_total`` of its scope.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from prometheus_client.core import Metric

from fleetscope.collectors.protocol import Collector, Finding, HealthCheck
from fleetscope.config import Config
from fleetscope.errors import Incomplete, NoHardware, SourceError
from fleetscope.metrics import efa
from fleetscope.metrics.detail import Detail
from fleetscope.metrics.efa import DEVICE_COUNTERS, PORT_COUNTERS
from fleetscope.sources.efa import CounterSet, EfaDevice, EfaReading, read_efa
from fleetscope.sources.fs import Root

ACTIVE = "ACTIVE"


def _names(counters: CounterSet) -> frozenset[str]:
    return frozenset(counters.values) | frozenset(counters.unreadable)


def _without(counters: CounterSet, drop: frozenset[str]) -> CounterSet:
    return replace(
        counters,
        values={k: v for k, v in counters.values.items() if k not in drop},
        unreadable=tuple(k for k in counters.unreadable if k not in drop),
    )


def in_own_scope(device: EfaDevice) -> EfaDevice:
    """The device with each curated counter in its own scope once.

    Pre-2021 drivers list one flat set of counters in both the device's and
    the ports' ``hw_counters``; a port counter at device level is their mark.
    """
    at_device = _names(device.counters)
    if not PORT_COUNTERS & at_device:
        return device
    ports = tuple(
        replace(port, counters=_without(port.counters, DEVICE_COUNTERS & at_device)) for port in device.ports
    )
    return replace(device, counters=_without(device.counters, PORT_COUNTERS), ports=ports)


def _in_table_order(values: Mapping[str, int]) -> list[tuple[str, int]]:
    """Known counters in the table's order, then unknown ones by name: a stable, readable exposition."""
    order = {key: index for index, key in enumerate(efa.TABLE.specs)}
    return sorted(values.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))


def efa_families(reading: EfaReading, expected_count: int = 0, detail: Detail | None = None) -> list[Metric]:
    """Map one reading to metric families (no file access); every series unless ``detail`` says less."""
    builder = (detail or Detail("all")).builder()
    builder.add(efa.DEVICES, (), len(reading.devices))
    if expected_count:
        builder.add(efa.EXPECTED_DEVICES, (), expected_count)
    for device in map(in_own_scope, reading.devices):
        first_port = device.ports[0] if device.ports else None
        builder.add_info(
            efa.INFO,
            (device.name,),
            {
                "pci_address": device.pci_address,
                "pci_device_id": device.pci_device_id,
                "numa_node": "" if device.numa_node is None else str(device.numa_node),
                "node_guid": device.node_guid,
                "fw_version": device.fw_version,
                "link_layer": (first_port.link_layer or "") if first_port else "",
            },
        )
        for raw, value in _in_table_order(device.counters.values):
            spec = efa.TABLE.get(raw) if raw in DEVICE_COUNTERS else None
            if spec is efa.VERBS_ERRORS_TOTAL:
                builder.add(spec, (device.name, raw.removesuffix("_err")), value)
            elif spec is not None:
                builder.add(spec, (device.name,), value)
            else:
                builder.add(efa.DEVICE_HW_STAT_TOTAL, (device.name, raw), value)
        for port in device.ports:
            port_labels = (device.name, str(port.number))
            builder.add(efa.PORT_RATE_BYTES_PER_SECOND, port_labels, port.rate_bytes_per_second)
            for raw, value in _in_table_order(port.counters.values):
                if raw in PORT_COUNTERS:
                    builder.add(efa.TABLE[raw], port_labels, value)
                else:
                    builder.add(efa.PORT_HW_STAT_TOTAL, (*port_labels, raw), value)
    return builder.families()


def blind_devices(reading: EfaReading) -> list[str]:
    """Devices that yield no counter at all, with why: the collector cannot watch them."""
    blind = [f"{bad.name}: {bad.reason}" for bad in reading.unreadable]
    for device in reading.devices:
        sets = [device.counters, *(port.counters for port in device.ports)]
        if not any(s.present for s in sets):
            blind.append(f"{device.name}: no hw_counters directory")
        elif not any(s.values for s in sets):
            blind.append(f"{device.name}: none of its counters could be read")
    return blind


def efa_findings(reading: EfaReading, expected_count: int = 0) -> list[Finding]:
    """Health findings for ``fleetscope check`` (pure: no file access).

    EFA hard-codes its port state to ACTIVE, so a port that is not ACTIVE means
    the device is not working at all; a device whose counters cannot be read
    cannot be watched.
    """
    findings = [Finding("efa", "unknown", f"efa {bad.name}", f"could not be read: {bad.reason}")
                for bad in reading.unreadable]
    found = len(reading.devices) + len(reading.unreadable)
    if expected_count and found < expected_count:
        findings.append(
            Finding("efa", "unhealthy", "node", f"{found} EFA devices found, {expected_count} expected")
        )
    for device in map(in_own_scope, reading.devices):
        subject = f"efa {device.name}"
        sets = [device.counters, *(port.counters for port in device.ports)]
        if not any(s.present for s in sets):
            findings.append(
                Finding(
                    "efa",
                    "unknown",
                    subject,
                    "no hw_counters directory (is fleetscope running in the host network namespace?)",
                )
            )
        elif not any(s.values for s in sets):
            unreadable = sum(len(s.unreadable) for s in sets)
            findings.append(
                Finding("efa", "unhealthy", subject, f"none of its {unreadable} counters could be read")
            )
        if not device.ports:
            findings.append(Finding("efa", "unhealthy", subject, "has no ports"))
        for port in device.ports:
            if port.state is None:
                findings.append(
                    Finding("efa", "unknown", subject, f"port {port.number} state could not be read")
                )
            elif port.state != ACTIVE:
                findings.append(
                    Finding("efa", "unhealthy", subject, f"port {port.number} is {port.state}, not ACTIVE")
                )
    return findings


class EfaCollector(Collector, HealthCheck):
    name = "efa"
    tables = (efa.TABLE,)

    def __init__(self, config: Config) -> None:
        self.sysfs = Root(config.path.sysfs)
        self.expected_count = config.efa.expected_count
        self.detail = Detail(config.collector(self.name).detail)

    def collect(self) -> list[Metric]:
        reading = read_efa(self.sysfs)
        if not reading.devices and not reading.unreadable and not self.expected_count:
            # with an expected count, zero devices is a finding to export, not an absence
            raise NoHardware(f"no EFA devices among {reading.rdma_devices} RDMA devices")
        families = efa_families(reading, self.expected_count, self.detail)
        blind = blind_devices(reading)
        if blind:
            found = len(reading.devices) + len(reading.unreadable)
            message = f"{len(blind)} of {found} EFA devices yield no counters: " + "; ".join(blind)
            if len(blind) == found:
                raise SourceError(message)
            raise Incomplete(message, families)
        return families

    def health(self) -> list[Finding]:
        return efa_findings(read_efa(self.sysfs), self.expected_count)
