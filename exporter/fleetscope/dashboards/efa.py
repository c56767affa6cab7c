"""EFA fabric: per-node throughput, retransmits, impaired connections, drops and errors."""

from __future__ import annotations

from typing import Any

from fleetscope.dashboards.kit import (
    UID_EFA,
    Q,
    build_dashboard,
    cluster_variable,
    link,
    node_url,
    ok,
    query_variable,
    rising,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from fleetscope.promql import EFA_RATE_COUNTERS, efa_rate

E = 'cluster=~"$cluster", instance=~"$instance"'
RATE = "[$__rate_interval]"
NODE_SERIES_LINK = link("Node detail", node_url("${__field.labels.instance}"))


def _per_node(counter: str, count: int = 10) -> str:
    """The ``count`` nodes with the highest rate of ``counter``, summed over their EFA devices.

    Counters the rules already record per node (:data:`fleetscope.promql.EFA_RATE_COUNTERS`) are read
    from the recording rule.
    """
    short = counter.removeprefix("fleetscope_efa_").removesuffix("_total")
    if short in EFA_RATE_COUNTERS:
        return f"topk({count}, {efa_rate(short)}{{{E}}})"
    return f"topk({count}, sum by (instance) (rate({counter}{{{E}}}{RATE})))"


def build() -> Any:
    variables = [
        cluster_variable(),
        query_variable("instance", "Node", 'label_values(fleetscope_efa_info{cluster=~"$cluster"}, instance)',
                       multi=True, include_all=True),
    ]
    summary = [
        stat_panel("Nodes with EFA", "none", ok("blue"), Q(f"count(fleetscope_efa_devices{{{E}}})"), width=6),
        stat_panel("EFA devices", "none", ok("blue"), Q(f"sum(fleetscope_efa_devices{{{E}}})"), width=6),
        stat_panel("Nodes missing EFA devices", "none", rising(1, 1),
                   Q(f"count(fleetscope_efa_expected_devices{{{E}}} > fleetscope_efa_devices{{{E}}}) or vector(0)"),
                   width=6,
                   description="Only nodes with a configured expected count (efa.expected-count) are checked."),
        stat_panel("Fabric throughput (tx)", "Bps", ok("blue"),
                   Q(f"sum({efa_rate('tx_bytes')}{{{E}}})"), width=6),
    ]
    traffic = [
        timeseries_panel("Transmit per node (top 10)", "Bps", ok(),
                         Q(_per_node("fleetscope_efa_tx_bytes_total"), "{{instance}}"), links=[NODE_SERIES_LINK]),
        timeseries_panel("Receive per node (top 10)", "Bps", ok(),
                         Q(_per_node("fleetscope_efa_rx_bytes_total"), "{{instance}}"), links=[NODE_SERIES_LINK]),
        timeseries_panel("RDMA read and write per node (top 10)", "Bps", ok(),
                         Q(_per_node("fleetscope_efa_rdma_read_bytes_total"), "{{instance}} read"),
                         Q(_per_node("fleetscope_efa_rdma_write_bytes_total"), "{{instance}} write"),
                         links=[NODE_SERIES_LINK]),
        timeseries_panel("Bottom 10 nodes by transmit", "Bps", ok(),
                         Q(f"bottomk(10, {efa_rate('tx_bytes')}{{{E}}})",
                           "{{instance}}"), links=[NODE_SERIES_LINK],
                         description="In a data-parallel job every node sends about the same; a low outlier is "
                                     "a node the collectives are waiting for."),
    ]
    errors = [
        timeseries_panel("Retransmitted packets per node (top 10)", "pps", rising(1, 100),
                         Q(_per_node("fleetscope_efa_retransmit_packets_total"), "{{instance}}"), width=8,
                         links=[NODE_SERIES_LINK]),
        timeseries_panel("Retransmit timeouts and unresponsive remotes (top 10)", "cps", rising(0.01, 1),
                         Q(_per_node("fleetscope_efa_retransmit_timeout_events_total"), "{{instance}} timeouts"),
                         Q(_per_node("fleetscope_efa_unresponsive_remote_events_total"), "{{instance}} unresponsive"),
                         width=8, links=[NODE_SERIES_LINK]),
        timeseries_panel("Impaired remote connections (top 10)", "cps", rising(0.01, 1),
                         Q(_per_node("fleetscope_efa_impaired_remote_connection_events_total"), "{{instance}}"),
                         width=8, links=[NODE_SERIES_LINK]),
        timeseries_panel("Receive drops per node (top 10)", "pps", rising(0.01, 1),
                         Q(_per_node("fleetscope_efa_rx_drops_total"), "{{instance}}"), width=8,
                         links=[NODE_SERIES_LINK]),
        timeseries_panel("RDMA work-request errors (top 10)", "cps", rising(0.01, 1),
                         Q(_per_node("fleetscope_efa_rdma_read_work_request_errors_total"), "{{instance}} read"),
                         Q(_per_node("fleetscope_efa_rdma_write_work_request_errors_total"), "{{instance}} write"),
                         width=8, links=[NODE_SERIES_LINK]),
        timeseries_panel("Admin command errors (top 10)", "cps", rising(0.01, 1),
                         Q(_per_node("fleetscope_efa_admin_command_errors_total"), "{{instance}}"), width=8,
                         links=[NODE_SERIES_LINK]),
    ]
    inventory = [
        table_panel("Device inventory", "none", ok(),
                    Q(f"fleetscope_efa_info{{{E}}}", table=True), width=24,
                    links=[link("Node detail", node_url("${__data.fields.instance}"))],
                    rename={"Value": "Present"},
                    description="Every EFA device with its PCI address, NUMA node and firmware."),
    ]
    return build_dashboard(
        UID_EFA, "fleetscope / EFA fabric",
        "The EFA fabric across nodes: throughput, retransmits, impaired connections, drops and errors.",
        variables,
        [("Summary", summary), ("Traffic", traffic), ("Errors", errors), ("Devices", inventory)],
    )
