"""EFA devices from sysfs (``class/infiniband``), and the EFA metric table.

An RDMA device is EFA when its PCI function's vendor is Amazon (0x1d0f):
names are ``rdmap<bus>s<slot>`` with rdma-core's udev rule and ``efa_N``
without it, and other RDMA devices (mlx5) share the class directory.

Counters live in two places since the 2021 driver split: traffic, RDMA and
SRD counters in ``ports/<n>/hw_counters/``, admin and verbs error counters in
the device's ``hw_counters/``. Older drivers put one flat list of 25 counters
in both; we then keep each counter in its own scope once. Both directories are
listed rather than probed, so a counter this table does not know is still
reported (under a generic name), and one the driver lacks stays absent.
Every file of a directory is read in one pass: a stale read makes the driver
query the device, and values are cached only for ``lifespan`` ms.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from fleetscope.sources.fs import Root, Unreadable
from fleetscope.spec import MetricSpec, table

logger = logging.getLogger("fleetscope.sources.efa")
T = TypeVar("T")

AMAZON_PCI_VENDOR = 0x1D0F
LIFESPAN = "lifespan"  # the counters' cache time in ms: a setting, not a counter

_PORT = ("device", "port")
_DEVICE = ("device",)


def _port(raw: str, name: str, help: str, unit: str = "") -> tuple[str, MetricSpec]:
    return raw, MetricSpec(name, "counter", help, _PORT, unit=unit, raw=f"ports/<n>/hw_counters/{raw}")


def _device(raw: str, name: str, help: str) -> tuple[str, MetricSpec]:
    return raw, MetricSpec(name, "counter", help, _DEVICE, raw=f"hw_counters/{raw}")


VERBS_OPERATIONS = (
    "alloc_pd",
    "create_qp",
    "create_cq",
    "reg_mr",
    "alloc_ucontext",
    "create_ah",
    "mmap",
    "alloc_mr",
    "get_dma_mr",
)
VERBS_ERRORS = MetricSpec(
    "fleetscope_efa_verbs_errors_total",
    "counter",
    "Failed verbs calls on the device, by operation (alloc_pd, create_qp, create_cq, reg_mr, ...).",
    ("device", "operation"),
    raw="hw_counters/<operation>_err",
)

EFA_TABLE = table(
    "efa",
    "EFA devices (PCI vendor 0x1d0f) from `/sys/class/infiniband`. "
    "Port counters from `ports/<n>/hw_counters/`, device counters from `hw_counters/`. Counters are totals since the driver loaded and can reset with it. "
    "A counter the driver does not have (SRD counters before EFA driver 2.17) is absent, not 0.",
    [
        _port("tx_bytes", "fleetscope_efa_tx_bytes_total", "Bytes transmitted by the port.", "bytes"),
        _port("tx_pkts", "fleetscope_efa_tx_packets_total", "Packets transmitted by the port."),
        _port("rx_bytes", "fleetscope_efa_rx_bytes_total", "Bytes received by the port.", "bytes"),
        _port("rx_pkts", "fleetscope_efa_rx_packets_total", "Packets received by the port."),
        _port("rx_drops", "fleetscope_efa_rx_drops_total", "Packets received and then dropped."),
        _port("send_bytes", "fleetscope_efa_send_bytes_total", "Bytes of send operations.", "bytes"),
        _port("send_wrs", "fleetscope_efa_send_work_requests_total", "Send work requests."),
        _port("recv_bytes", "fleetscope_efa_recv_bytes_total", "Bytes of receive operations.", "bytes"),
        _port("recv_wrs", "fleetscope_efa_recv_work_requests_total", "Receive work requests."),
        _port("rdma_read_wrs", "fleetscope_efa_rdma_read_work_requests_total", "RDMA read work requests."),
        _port(
            "rdma_read_bytes", "fleetscope_efa_rdma_read_bytes_total", "Bytes read by RDMA reads.", "bytes"
        ),
        _port(
            "rdma_read_wr_err",
            "fleetscope_efa_rdma_read_work_request_errors_total",
            "RDMA read work requests that completed with an error.",
        ),
        _port(
            "rdma_read_resp_bytes",
            "fleetscope_efa_rdma_read_response_bytes_total",
            "Bytes sent in responses to remote RDMA reads.",
            "bytes",
        ),
        _port(
            "rdma_write_wrs",
            "fleetscope_efa_rdma_write_work_requests_total",
            "RDMA write work requests (0 on devices without RDMA write).",
        ),
        _port(
            "rdma_write_bytes",
            "fleetscope_efa_rdma_write_bytes_total",
            "Bytes written by RDMA writes.",
            "bytes",
        ),
        _port(
            "rdma_write_wr_err",
            "fleetscope_efa_rdma_write_work_request_errors_total",
            "RDMA write work requests that completed with an error.",
        ),
        _port(
            "rdma_write_recv_bytes",
            "fleetscope_efa_rdma_write_recv_bytes_total",
            "Bytes received by remote RDMA writes.",
            "bytes",
        ),
        _port("retrans_bytes", "fleetscope_efa_retransmit_bytes_total", "SRD bytes retransmitted.", "bytes"),
        _port("retrans_pkts", "fleetscope_efa_retransmit_packets_total", "SRD packets retransmitted."),
        _port(
            "retrans_timeout_events",
            "fleetscope_efa_retransmit_timeout_events_total",
            "Times SRD traffic timed out and needed a network path change.",
        ),
        _port(
            "unresponsive_remote_events",
            "fleetscope_efa_unresponsive_remote_events_total",
            "Times an SRD connection's remote was unresponsive.",
        ),
        _port(
            "impaired_remote_conn_events",
            "fleetscope_efa_impaired_remote_connection_events_total",
            "SRD connections that entered an impaired state (reduced rate limit).",
        ),
        _device(
            "submitted_cmds",
            "fleetscope_efa_admin_commands_submitted_total",
            "Admin-queue commands submitted to the device.",
        ),
        _device(
            "completed_cmds",
            "fleetscope_efa_admin_commands_completed_total",
            "Admin-queue commands the device completed.",
        ),
        _device("cmds_err", "fleetscope_efa_admin_command_errors_total", "Admin-queue commands that failed."),
        _device(
            "no_completion_cmds",
            "fleetscope_efa_admin_commands_no_completion_total",
            "Admin-queue commands that never completed (device or admin-queue trouble).",
        ),
        _device(
            "keep_alive_rcvd",
            "fleetscope_efa_keep_alive_events_total",
            "Keep-alive events received from the device (should keep growing).",
        ),
        *((f"{operation}_err", VERBS_ERRORS) for operation in VERBS_OPERATIONS),
        (
            "port_counter",
            MetricSpec(
                "fleetscope_efa_port_hw_stat_total",
                "counter",
                "A port counter this fleetscope version has no curated name for, by its sysfs file name.",
                ("device", "port", "counter"),
                raw="ports/<n>/hw_counters/<counter>",
            ),
        ),
        (
            "device_counter",
            MetricSpec(
                "fleetscope_efa_device_hw_stat_total",
                "counter",
                "A device counter this fleetscope version has no curated name for, by its sysfs file name.",
                ("device", "counter"),
                raw="hw_counters/<counter>",
            ),
        ),
        (
            "devices",
            MetricSpec(
                "fleetscope_efa_devices",
                "gauge",
                "EFA devices found on the node (RDMA devices with PCI vendor 0x1d0f).",
                raw="class/infiniband/*/device/vendor",
            ),
        ),
        (
            "expected_devices",
            MetricSpec(
                "fleetscope_efa_expected_devices",
                "gauge",
                "EFA devices this node should have (setting efa.expected-count; absent when not configured).",
            ),
        ),
        (
            "info",
            MetricSpec(
                "fleetscope_efa_info",
                "info",
                "One EFA device: its PCI function, NUMA node and identity.",
                _DEVICE,
                info_keys=(
                    "pci_address",
                    "pci_device_id",
                    "numa_node",
                    "node_guid",
                    "fw_version",
                    "link_layer",
                ),
            ),
        ),
        (
            "rate",
            MetricSpec(
                "fleetscope_efa_port_rate_bytes_per_second",
                "gauge",
                "Link rate the port reports.",
                _PORT,
                unit="bytes/second",
                raw="ports/<n>/rate",
            ),
        ),
    ],
)

# The curated counters of each scope: a table key that names its own sysfs counter file.
PORT_COUNTERS = frozenset(
    k for k, s in EFA_TABLE.specs.items() if s.kind == "counter" and s.raw == f"ports/<n>/hw_counters/{k}"
)
DEVICE_COUNTERS = frozenset(
    k
    for k, s in EFA_TABLE.specs.items()
    if s.kind == "counter" and (s.raw == f"hw_counters/{k}" or s is VERBS_ERRORS)
)


@dataclass(frozen=True)
class CounterSet:
    """What one ``hw_counters`` directory held."""

    present: bool  # the directory exists (it does not outside the init network namespace)
    values: Mapping[str, int] = field(default_factory=dict)
    unreadable: tuple[str, ...] = ()  # files listed but not readable as a number
    lifespan_ms: int | None = None


@dataclass(frozen=True)
class EfaPort:
    number: int
    state: str | None  # "ACTIVE" from "4: ACTIVE"
    phys_state: str | None
    rate_bytes_per_second: float | None
    link_layer: str | None
    counters: CounterSet


@dataclass(frozen=True)
class EfaDevice:
    name: str
    pci_address: str
    pci_device_id: str
    numa_node: int | None
    node_guid: str
    fw_version: str
    counters: CounterSet
    ports: tuple[EfaPort, ...]
    layout: Literal["split", "flat"] = "split"


@dataclass(frozen=True)
class EfaReading:
    devices: tuple[EfaDevice, ...]
    rdma_devices: int  # every device in class/infiniband, EFA or not
    class_present: bool  # class/infiniband exists at all (the ib_core module is loaded)


# -- parsers: text in, value out; each raises ValueError on text it does not understand -----------


def parse_counter(text: str) -> int:
    """One hw_counters file: an unsigned decimal integer. ``N/A (no PMA)`` and garbage are refused."""
    if not text.isdigit():
        raise ValueError(f"not a counter value: {text[:40]!r}")
    return int(text)


def parse_state(text: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    number, sep, name = text.partition(":")
    if not sep or not number.strip().isdigit() or not name.strip():
        raise ValueError(f"not a port state: {text[:40]!r}")
    return name.strip()


def parse_rate(text: str) -> float:
    """``100 Gb/sec (4X EDR)`` -> bytes per second (12.5e9)."""
    number, _, rest = text.partition(" ")
    if not rest.startswith("Gb/sec"):
        raise ValueError(f"not a link rate: {text[:40]!r}")
    return float(number) * 1e9 / 8


def parse_hex_id(text: str) -> int:
    """``0x1d0f`` -> 0x1d0f."""
    if not text.lower().startswith("0x"):
        raise ValueError(f"not a PCI id: {text[:40]!r}")
    return int(text, 16)


# -- reading ----------------------------------------------------------------------------------------


def _read_counters(sysfs: Root, *parts: str) -> CounterSet:
    names = sysfs.listdir(*parts)
    if not names and not sysfs.exists(*parts):
        return CounterSet(present=False)
    values: dict[str, int] = {}
    unreadable: list[str] = []
    lifespan: int | None = None
    for name in names:
        try:
            value = parse_counter(sysfs.read_attr(*parts, name))
        except (Unreadable, ValueError) as exc:
            logger.debug("skipping %s: %s", "/".join((*parts, name)), exc)
            if name != LIFESPAN:  # a setting, not one of the counters
                unreadable.append(name)
            continue
        if name == LIFESPAN:
            lifespan = value
        else:
            values[name] = value
    return CounterSet(True, values, tuple(unreadable), lifespan)


def _optional(sysfs: Root, parse: Callable[[str], T], *parts: str) -> T | None:
    """An attribute parsed, or None when it is absent, unreadable or not understood."""
    text = sysfs.read_attr_or_none(*parts)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:
        return None


def _read_port(sysfs: Root, device: str, number: int) -> EfaPort:
    base = ("class", "infiniband", device, "ports", str(number))
    return EfaPort(
        number=number,
        state=_optional(sysfs, parse_state, *base, "state"),
        phys_state=_optional(sysfs, parse_state, *base, "phys_state"),
        rate_bytes_per_second=_optional(sysfs, parse_rate, *base, "rate"),
        link_layer=sysfs.read_attr_or_none(*base, "link_layer"),
        counters=_read_counters(sysfs, *base, "hw_counters"),
    )


def _split_flat(device_set: CounterSet, ports: tuple[EfaPort, ...]) -> tuple[CounterSet, tuple[EfaPort, ...]]:
    """Pre-2021 drivers list all 25 counters in both scopes: keep each in its own scope once."""

    def keep(counters: CounterSet, drop: frozenset[str]) -> CounterSet:
        return CounterSet(
            counters.present,
            {k: v for k, v in counters.values.items() if k not in drop},
            tuple(k for k in counters.unreadable if k not in drop),
            counters.lifespan_ms,
        )

    at_device = frozenset(device_set.values) | frozenset(device_set.unreadable)
    new_ports = tuple(
        EfaPort(
            p.number,
            p.state,
            p.phys_state,
            p.rate_bytes_per_second,
            p.link_layer,
            keep(p.counters, DEVICE_COUNTERS & at_device),
        )
        for p in ports
    )
    return keep(device_set, PORT_COUNTERS), new_ports


def _read_device(sysfs: Root, name: str) -> EfaDevice | None:
    """One EFA device, or None if it is not EFA or vanished while being read."""
    base = ("class", "infiniband", name)
    try:
        vendor = parse_hex_id(sysfs.read_attr(*base, "device", "vendor"))
    except (Unreadable, ValueError):
        return None
    if vendor != AMAZON_PCI_VENDOR:
        return None
    ports = tuple(
        _read_port(sysfs, name, int(number)) for number in sysfs.listdir(*base, "ports") if number.isdigit()
    )
    device_set = _read_counters(sysfs, *base, "hw_counters")
    layout: Literal["split", "flat"] = "split"
    if PORT_COUNTERS & (frozenset(device_set.values) | frozenset(device_set.unreadable)):
        layout = "flat"
        device_set, ports = _split_flat(device_set, ports)
    numa = _optional(sysfs, int, *base, "device", "numa_node")
    device = EfaDevice(
        name=name,
        pci_address=sysfs.link_target(*base, "device") or "",
        pci_device_id=sysfs.read_attr_or_none(*base, "device", "device") or "",
        numa_node=numa if numa is not None and numa >= 0 else None,
        node_guid=sysfs.read_attr_or_none(*base, "node_guid") or "",
        fw_version=sysfs.read_attr_or_none(*base, "fw_ver") or "",
        counters=device_set,
        ports=ports,
        layout=layout,
    )
    if not sysfs.exists(*base):
        # hot-unplugged or driver unloaded mid-read: a half reading would look like counter resets
        logger.debug("EFA device %s vanished while being read", name)
        return None
    return device


def read_efa(sysfs: Root) -> EfaReading:
    """Every EFA device under ``class/infiniband`` (possibly none)."""
    names = sysfs.listdir("class", "infiniband")
    devices = tuple(d for d in (_read_device(sysfs, n) for n in names) if d is not None)
    return EfaReading(devices, len(names), sysfs.exists("class", "infiniband"))
