"""EFA, ENA, TCP and interface rules.

EFA ports always read ACTIVE/LinkUp, so EFA health comes only from counter
growth (drops, retransmit timeouts, remote events, work-request errors).
"""

from __future__ import annotations

from fleetscope.metrics import efa, netstat
from fleetscope.promql import (
    EFA_RATE_COUNTERS,
    ENA_ALLOWANCE_SHAPED,
    TCP_RETRANSMIT_RATIO,
    efa_rate,
    indent,
    interface_ratio,
)
from fleetscope.rules.model import Alert, Group, Record, held, num, sel
from fleetscope.rules.settings import Settings

# Per device and port at --collector.efa.detail=all; the node's devices summed at the default level.
EFA_PORT = (
    "{{ with $labels.device }}EFA {{ . }} port {{ $labels.port }}{{ else }}EFA{{ end }} on {{ $labels.instance }}"
)
ENA_ALLOWANCES = ("bw_in", "bw_out", "pps", "conntrack", "linklocal")


def labelled_union(pieces: list[tuple[str, str]], label: str) -> str:
    """``or`` of expressions, each tagged with ``label`` = its name (a one-line expression on one line)."""
    def tag(value: str, expr: str) -> str:
        if "\n" not in expr:
            return f'label_replace({expr}, "{label}", "{value}", "", "")'
        return f'label_replace(\n  {indent(expr)},\n  "{label}", "{value}", "", ""\n)'
    return "\nor\n".join(tag(value, expr) for value, expr in pieces)


def recording_rules(s: Settings) -> list[Group]:
    # The node sums over the share window as well: their readers (the network alerts, which wait 10m or more, the
    # straggler cause's network evidence, the dashboards) need no longer one, and at the slow interval below
    # every sample is still read once.
    w = s.share_window
    rules = [
        Record(
            efa_rate(counter), f"sum without (device, port) (rate({sel(s, f'fleetscope_efa_{counter}_total')}[{w}]))"
        )
        for counter in EFA_RATE_COUNTERS
    ]
    rules.append(Record(
        TCP_RETRANSMIT_RATIO,
        f"rate({sel(s, netstat.RETRANSMITTED_SEGMENTS_TOTAL)}[{w}])\n  /\n"
        f"rate({sel(s, netstat.OUT_SEGMENTS_TOTAL)}[{w}])",
    ))
    shaped = [(kind, f"rate({sel(s, f'fleetscope_ena_{kind}_allowance_exceeded_total')}[{w}])")
              for kind in ENA_ALLOWANCES]
    rules.append(Record(ENA_ALLOWANCE_SHAPED, f"(\n  {indent(labelled_union(shaped, 'allowance'))}\n) > 0"))
    groups = [Group("fleetscope-network.rules", tuple(rules), interval=s.slow_evaluation_interval)]
    # Each interface ratio reads four counters of every interface: a group each (a group's rules run one after
    # another, groups side by side; together with the rest they took 1.7 s an evaluation at 2,048 nodes).
    for what in ("errors", "dropped"):
        pieces = [
            (direction, (
                f"rate({sel(s, f'fleetscope_net_{direction}_{what}_total')}[{w}])\n  /\n"
                f"rate({sel(s, f'fleetscope_net_{direction}_packets_total')}[{w}])"
            ))
            for direction in ("receive", "transmit")
        ]
        record = Record(interface_ratio(what), labelled_union(pieces, "direction"))
        name = {"errors": "errors", "dropped": "drops"}[what]
        groups.append(Group(f"fleetscope-interface-{name}.rules", (record,), interval=s.slow_evaluation_interval))
    return groups


def alert_rules(s: Settings) -> Group:
    w, ev = s.rate_window, s.efa_event_for

    def efa_events(name: str, counter: str, summary: str, what: str) -> Alert:
        return Alert(
            name, f"increase({sel(s, f'fleetscope_efa_{counter}_total')}[{w}]) > 0", "warning", summary,
            f"{EFA_PORT} counted {{{{ $value | humanize }}}} {what} in the last {w}.", ev,
        )

    wr_errors = [
        (op, f"increase({sel(s, f'fleetscope_efa_{op}_work_request_errors_total')}[{w}]) > 0")
        for op in ("rdma_read", "rdma_write")
    ]
    admin = [
        (kind, f"increase({sel(s, f'fleetscope_efa_{counter}_total')}[{w}]) > 0")
        for kind, counter in (("error", "admin_command_errors"), ("no_completion", "admin_commands_no_completion"))
    ]
    alerts = [
        Alert(
            "EfaDevicesMissing",
            f"{held(s, efa.DEVICES)} < {held(s, efa.EXPECTED_DEVICES)}",
            "critical",
            "A node has fewer EFA devices than expected.",
            "{{ $labels.instance }} has {{ $value }} EFA devices"
            f"{{{{ with printf `{sel(s, efa.EXPECTED_DEVICES, 'instance=%q')}` "
            "$labels.instance | query }}"
            ", {{ . | first | value }} expected{{ end }}.",
            s.efa_missing_for,
        ),
        Alert(
            "EfaRxDrops",
            f"rate({sel(s, efa.RX_DROPS_TOTAL)}[{w}]) > {num(s.efa_rx_drops_per_second)}",
            "warning",
            "An EFA device drops received packets.",
            f"{EFA_PORT} drops {{{{ printf \"%.1f\" $value }}}} received packets per second.",
            ev,
        ),
        efa_events("EfaRetransmitTimeouts", "retransmit_timeout_events",
                   "EFA SRD traffic hits retransmit timeouts and changes network path.", "SRD retransmit timeouts"),
        efa_events("EfaImpairedRemoteConnections", "impaired_remote_connection_events",
                   "EFA SRD connections enter the impaired (rate-limited) state.", "impaired remote connection events"),
        efa_events("EfaUnresponsiveRemote", "unresponsive_remote_events",
                   "EFA SRD remotes stop responding.", "unresponsive remote events"),
        Alert(
            "EfaRdmaWorkRequestErrors", labelled_union(wr_errors, "operation"), "warning",
            "An EFA device completes RDMA work requests with errors.",
            f"{EFA_PORT} had {{{{ $value | humanize }}}} {{{{ $labels.operation }}}} work-request errors "
            f"in the last {w}.",
            ev,
        ),
        Alert(
            "EfaAdminCommandErrors", labelled_union(admin, "failure"), "warning",
            "An EFA device fails admin commands.",
            "{{ with $labels.device }}EFA device {{ . }}{{ else }}An EFA device{{ end }} on {{ $labels.instance }} "
            "had {{ $value | humanize }} admin commands "
            f"ending in {{{{ $labels.failure }}}} in the last {w}"
            "{{ if not $labels.device }} (the node's devices summed: `--collector.efa.detail=all` names the "
            "device){{ end }}.",
            ev,
        ),
        Alert(
            "EnaAllowanceExceeded", f"{ENA_ALLOWANCE_SHAPED} > {num(s.ena_allowance_per_second)}", "warning",
            "An ENA interface exceeds an EC2 instance network allowance.",
            "{{ $labels.device }} on {{ $labels.instance }} has {{ printf \"%.1f\" $value }} packets per second "
            "shaped by the {{ $labels.allowance }} allowance.",
            s.ena_for,
        ),
        Alert(
            "TcpRetransmitRatioHigh", f"{TCP_RETRANSMIT_RATIO} > {num(s.tcp_retransmit_ratio)}", "warning",
            "A node retransmits a high share of its TCP segments.",
            "{{ $labels.instance }} retransmits {{ $value | humanizePercentage }} of its TCP segments "
            f"(threshold {num(s.tcp_retransmit_ratio * 100)}%).",
            s.tcp_for,
        ),
    ]
    interface_alerts = (("errors", "NetworkInterfaceErrors", "errors"), ("dropped", "NetworkInterfaceDrops", "drops"))
    for what, name, noun in interface_alerts:
        alerts.append(Alert(
            name, f"{interface_ratio(what)} > {num(s.interface_error_ratio)}", "warning",
            f"A network interface has a high {noun[:-1]} rate.",
            f"{{{{ $labels.device }}}} on {{{{ $labels.instance }}}}: {{{{ $value | humanizePercentage }}}} of "
            f"{{{{ $labels.direction }}}} packets are {noun} (threshold {num(s.interface_error_ratio * 100)}%).",
            s.interface_for,
        ))
    return Group("fleetscope-network", tuple(alerts), interval=s.slow_evaluation_interval)
