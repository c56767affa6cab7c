"""Node-wide TCP counters from ``/proc/net/snmp`` and ``/proc/net/netstat``, keyed ``Section.Field``."""

from __future__ import annotations

from fleetscope.metrics.spec import MetricSpec, table

PREFIX = "fleetscope_tcp_"
_SNMP_SECTIONS = ("Ip", "Icmp", "IcmpMsg", "Tcp", "Udp", "UdpLite")


def _counter(key: str, name: str, help: str) -> MetricSpec:
    file = "net/snmp" if key.split(".", maxsplit=1)[0] in _SNMP_SECTIONS else "net/netstat"
    return MetricSpec(name, "counter", help, raw=f"{file} {key}")


RETRANSMITTED_SEGMENTS_TOTAL = _counter(
    "Tcp.RetransSegs", "fleetscope_tcp_retransmitted_segments_total",
    "TCP segments retransmitted (retransmit ratio: rate of this over rate of out segments).")
OUT_SEGMENTS_TOTAL = _counter("Tcp.OutSegs", "fleetscope_tcp_out_segments_total", "TCP segments sent.")
IN_SEGMENTS_TOTAL = _counter("Tcp.InSegs", "fleetscope_tcp_in_segments_total", "TCP segments received.")
IN_ERRORS_TOTAL = _counter("Tcp.InErrs", "fleetscope_tcp_in_errors_total", "TCP segments received with errors.")
TIMEOUTS_TOTAL = _counter(
    "TcpExt.TCPTimeouts", "fleetscope_tcp_timeouts_total", "TCP retransmission timeouts (RTO fired).")
LOST_RETRANSMITS_TOTAL = _counter(
    "TcpExt.TCPLostRetransmit", "fleetscope_tcp_lost_retransmits_total",
    "TCP retransmissions that were lost again.")
SYN_RETRANSMITS_TOTAL = _counter(
    "TcpExt.TCPSynRetrans", "fleetscope_tcp_syn_retransmits_total",
    "TCP SYN retransmissions (slow connection set-up, e.g. rendezvous or NCCL bootstrap).")
LISTEN_OVERFLOWS_TOTAL = _counter(
    "TcpExt.ListenOverflows", "fleetscope_tcp_listen_overflows_total",
    "Connections dropped because a listener's accept queue was full.")
LISTEN_DROPS_TOTAL = _counter(
    "TcpExt.ListenDrops", "fleetscope_tcp_listen_drops_total",
    "Connection requests a listener dropped (any reason, overflows included).")
RECEIVE_QUEUE_DROPS_TOTAL = _counter(
    "TcpExt.TCPRcvQDrop", "fleetscope_tcp_receive_queue_drops_total",
    "Segments dropped because a socket's receive queue was full.")

TABLE = table(
    "netstat",
    "Node-wide TCP counters from `/proc/net/snmp` and `/proc/net/netstat` (host network namespace).",
    [
        (spec.raw.partition(" ")[2], spec)
        for spec in (
            RETRANSMITTED_SEGMENTS_TOTAL, OUT_SEGMENTS_TOTAL, IN_SEGMENTS_TOTAL, IN_ERRORS_TOTAL, TIMEOUTS_TOTAL,
            LOST_RETRANSMITS_TOTAL, SYN_RETRANSMITS_TOTAL, LISTEN_OVERFLOWS_TOTAL, LISTEN_DROPS_TOTAL,
            RECEIVE_QUEUE_DROPS_TOTAL,
        )
    ],
)
