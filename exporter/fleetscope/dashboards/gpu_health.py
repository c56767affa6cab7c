"""GPU health, fleet-wide: the questions of Grafana's "GPU Health" boards, answered with fleetscope's metrics.

Which nodes miss GPUs, which GPUs have remapped rows or failed remaps, where
Xids happened and what they ask for, which GPUs run hot or slow down.
"""

from __future__ import annotations

from typing import Any

from fleetscope.dashboards.kit import (
    UID_GPU_HEALTH,
    Q,
    bargauge_panel,
    build_dashboard,
    cluster_variable,
    link,
    mappings,
    node_url,
    ok,
    query_variable,
    rising,
    stat_panel,
    state_timeline_panel,
    table_panel,
    timeseries_panel,
    xid_annotation,
)
from fleetscope.dashboards.node import RECOVERY_ACTIONS
from fleetscope.promql import GPU_THROTTLE_SHARE, SLOWDOWN_REASONS

H = 'cluster=~"$cluster", instance=~"$instance"'
HG = H + ', gpu=~"$gpu"'
RATE = "[$__rate_interval]"
NODE_LINK = link("Node detail", node_url("${__data.fields.instance}"))
NODE_SERIES_LINK = link("Node detail", node_url("${__field.labels.instance}"))


def _worst(expr: str, count: int = 20) -> str:
    return f"topk({count}, {expr})"


def build() -> Any:
    variables = [
        cluster_variable(),
        query_variable("instance", "Node", 'label_values(fleetscope_gpu_info{cluster=~"$cluster"}, instance)',
                       multi=True, include_all=True),
        query_variable("gpu", "GPU", f"label_values(fleetscope_gpu_info{{{H}}}, gpu)", multi=True, include_all=True),
    ]
    expected = f"(fleetscope_gpu_expected_devices{{{H}}} or fleetscope_gpu_pci_devices{{{H}}})"
    summary = [
        stat_panel("Nodes reporting GPUs", "none", ok("blue"), Q(f"count(fleetscope_gpu_nvml_devices{{{H}}})")),
        stat_panel("GPUs visible", "none", ok("blue"), Q(f"sum(fleetscope_gpu_nvml_devices{{{H}}})")),
        stat_panel("GPUs missing", "none", rising(1, 1),
                   Q(f"sum({expected} - fleetscope_gpu_nvml_devices{{{H}}})"),
                   description="Expected (configured, else on the PCI bus) minus visible to NVML."),
        stat_panel("GPUs with failed row remap", "none", rising(1, 1),
                   Q(f"count(fleetscope_gpu_row_remap_failed{{{HG}}} > 0) or vector(0)")),
        stat_panel("GPUs with pending row remap", "none", rising(1, 1),
                   Q(f"count(fleetscope_gpu_row_remap_pending{{{HG}}} > 0) or vector(0)")),
        stat_panel("GPUs needing recovery", "none", rising(1, 1),
                   Q(f"count(fleetscope_gpu_recovery_action{{{HG}}} > 0) or vector(0)")),
    ]
    inventory = [
        state_timeline_panel("Missing GPUs per node", "none", rising(1, 1),
                             Q(f"{expected} - fleetscope_gpu_nvml_devices{{{H}}}", "{{instance}}"), width=24,
                             links=[NODE_SERIES_LINK],
                             description="Green: all expected GPUs visible. Red: NVML sees fewer GPUs than expected."),
    ]
    memory = [
        table_panel("Uncorrectable remapped rows (worst 20)", "none", rising(1, 1),
                    Q(_worst(f'sum by (instance, gpu) (fleetscope_gpu_remapped_rows{{cause="uncorrectable", {HG}}})'),
                      table=True), width=8, links=[NODE_LINK], sort_by="Rows", rename={"Value": "Rows"}),
        table_panel("Correctable remapped rows (worst 20)", "none", rising(1, 100),
                    Q(_worst(f'sum by (instance, gpu) (fleetscope_gpu_remapped_rows{{cause="correctable", {HG}}})'),
                      table=True), width=8, links=[NODE_LINK], sort_by="Rows", rename={"Value": "Rows"}),
        table_panel("Uncorrected ECC errors, volatile (worst 20)", "none", rising(1, 1),
                    Q(_worst(f'sum by (instance, gpu) (fleetscope_gpu_ecc_errors_total{{error_type="uncorrected", '
                             f'counter_type="volatile", {HG}}})'), table=True),
                    width=8, links=[NODE_LINK], sort_by="Errors", rename={"Value": "Errors"}),
    ]
    xids = [
        table_panel("Last Xid per GPU", "dateTimeAsIso", ok(),
                    Q(_worst(f"fleetscope_gpu_last_xid_timestamp_seconds{{{HG}}} * 1000"), table=True),
                    width=8, links=[NODE_LINK], sort_by="Last Xid", rename={"Value": "Last Xid"},
                    description="When each GPU last logged an Xid (newest first)."),
        bargauge_panel("Xid events by code (last hour)", "none", rising(1, 10),
                       Q(f"sum by (xid, action) (increase(fleetscope_gpu_xid_errors_total{{{HG}}}[1h]))",
                         "Xid {{xid}} ({{action}})", instant=True)),
        table_panel("Recovery action requested (worst 20)", "none", rising(1, 2),
                    Q(_worst(f"max by (instance, gpu) (fleetscope_gpu_recovery_action{{{HG}}})"), table=True),
                    width=8, links=[NODE_LINK], sort_by="Action", rename={"Value": "Action"},
                    value_mappings={"Action": mappings(RECOVERY_ACTIONS)}),
    ]
    thermal = [
        timeseries_panel("Thermal and power slowdown (worst 10 GPUs)", "percentunit", rising(0.05, 0.2),
                         Q(_worst(f"sum by (instance, gpu) "
                                  f'({GPU_THROTTLE_SHARE}{{reason=~"{SLOWDOWN_REASONS}", {HG}}})', 10),
                           "{{instance}} GPU {{gpu}}"), width=8, minimum=0, links=[NODE_SERIES_LINK],
                         description="Share of time with clocks lowered for temperature or power-brake reasons."),
        timeseries_panel("Hottest GPU per node", "celsius", rising(80, 87),
                         Q(f"max by (instance) (fleetscope_gpu_temperature_celsius{{{HG}}})", "{{instance}}"), width=8,
                         links=[NODE_SERIES_LINK]),
        timeseries_panel("PCIe replays", "cps", rising(1, 10),
                         Q(_worst(f"sum by (instance, gpu) (rate(fleetscope_gpu_pcie_replays_total{{{HG}}}{RATE}))",
                                  10),
                           "{{instance}} GPU {{gpu}}"), width=8, links=[NODE_SERIES_LINK],
                         description="PCIe link replays; a steady rate points at a marginal riser or slot."),
    ]
    return build_dashboard(
        UID_GPU_HEALTH, "fleetscope / GPU health",
        "Fleet-wide GPU health: missing GPUs, row remapping, ECC, Xid events, recovery actions, thermal slowdown.",
        variables,
        [("Summary", summary), ("GPU inventory", inventory), ("Memory errors", memory), ("Xid events", xids),
         ("Thermal and PCIe", thermal)],
        annotations=[xid_annotation(HG)],
    )
