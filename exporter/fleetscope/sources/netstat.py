"""TCP/IP counters from procfs (``net/snmp``, ``net/netstat``), and their metric table.

Both files are pairs of lines, ``Proto: Name1 Name2 ...`` then
``Proto: v1 v2 ...``. Kernels append fields over time, so values are looked
up by header name, never by position. The files are per network namespace:
the daemon must run in the host's (hostNetwork) to see the node's counters.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from fleetscope.errors import SourceError
from fleetscope.sources.fs import Root, Unreadable
from fleetscope.spec import MetricSpec, table

logger = logging.getLogger("fleetscope.sources.netstat")


def _counter(key: str, name: str, help: str) -> tuple[str, MetricSpec]:
    section = key.split(".")[0]
    file = "net/snmp" if section in ("Ip", "Icmp", "IcmpMsg", "Tcp", "Udp", "UdpLite") else "net/netstat"
    return key, MetricSpec(name, "counter", help, raw=f"{file} {key}")


NETSTAT_TABLE = table(
    "netstat",
    "Node-wide TCP counters from `/proc/net/snmp` and `/proc/net/netstat` (host network namespace).",
    [
        _counter(
            "Tcp.RetransSegs",
            "fleetscope_tcp_retransmitted_segments_total",
            "TCP segments retransmitted (retransmit ratio: rate of this over rate of out segments).",
        ),
        _counter("Tcp.OutSegs", "fleetscope_tcp_out_segments_total", "TCP segments sent."),
        _counter("Tcp.InSegs", "fleetscope_tcp_in_segments_total", "TCP segments received."),
        _counter("Tcp.InErrs", "fleetscope_tcp_in_errors_total", "TCP segments received with errors."),
        _counter(
            "TcpExt.TCPTimeouts", "fleetscope_tcp_timeouts_total", "TCP retransmission timeouts (RTO fired)."
        ),
        _counter(
            "TcpExt.TCPLostRetransmit",
            "fleetscope_tcp_lost_retransmits_total",
            "TCP retransmissions that were lost again.",
        ),
        _counter(
            "TcpExt.TCPSynRetrans",
            "fleetscope_tcp_syn_retransmits_total",
            "TCP SYN retransmissions (slow connection set-up, e.g. rendezvous or NCCL bootstrap).",
        ),
        _counter(
            "TcpExt.ListenOverflows",
            "fleetscope_tcp_listen_overflows_total",
            "Connections dropped because a listener's accept queue was full.",
        ),
        _counter(
            "TcpExt.ListenDrops",
            "fleetscope_tcp_listen_drops_total",
            "Connection requests a listener dropped (any reason, overflows included).",
        ),
        _counter(
            "TcpExt.TCPRcvQDrop",
            "fleetscope_tcp_receive_queue_drops_total",
            "Segments dropped because a socket's receive queue was full.",
        ),
    ],
)


@dataclass(frozen=True)
class NetstatReading:
    """``(section, field) -> value`` from both files, e.g. ``("Tcp", "RetransSegs")``."""

    values: Mapping[tuple[str, str], int]

    def get(self, key: str) -> int | None:
        section, _, name = key.partition(".")
        return self.values.get((section, name))


def parse_pairs(text: str) -> dict[tuple[str, str], int]:
    """Parse header/value line pairs. A section whose lines do not pair up is skipped whole;
    a field whose value is not an integer is skipped alone."""
    values: dict[tuple[str, str], int] = {}
    lines = [line for line in text.splitlines() if line.strip()]
    index = 0
    while index + 1 < len(lines):
        header, data = lines[index], lines[index + 1]
        section, sep, names_text = header.partition(":")
        data_section, data_sep, numbers_text = data.partition(":")
        if not sep or not data_sep or section != data_section:
            # out of step: resynchronise on the next line
            logger.debug("netstat: unpaired line %r", header[:60])
            index += 1
            continue
        index += 2
        names, numbers = names_text.split(), numbers_text.split()
        if len(names) != len(numbers):
            logger.debug("netstat: section %s has %d names and %d values", section, len(names), len(numbers))
            continue
        for name, number in zip(names, numbers, strict=True):
            try:
                values[(section, name)] = int(number)
            except ValueError:
                logger.debug("netstat: %s.%s is not an integer: %r", section, name, number[:40])
    return values


def read_netstat(procfs: Root) -> NetstatReading:
    """Counters of both files; raises :class:`SourceError` if neither can be read."""
    values: dict[tuple[str, str], int] = {}
    errors: list[str] = []
    for name in ("snmp", "netstat"):
        try:
            values.update(parse_pairs(procfs.read_file("net", name)))
        except Unreadable as exc:
            errors.append(str(exc))
    if len(errors) == 2:
        raise SourceError("; ".join(errors))
    return NetstatReading(values)
