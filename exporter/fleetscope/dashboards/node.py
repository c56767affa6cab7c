"""Node detail: one node's GPUs, EFA devices, host network and the ranks running on it."""

from __future__ import annotations

from typing import Any

from fleetscope.dashboards import exprs
from fleetscope.dashboards.kit import (
    UID_NODE,
    Q,
    alerts_annotation,
    build_dashboard,
    cluster_variable,
    falling,
    job_url,
    link,
    mappings,
    ok,
    query_variable,
    rising,
    stat_panel,
    table_panel,
    timeseries_panel,
    xid_annotation,
)
from fleetscope.metrics import gpu as gpu_metrics
from fleetscope.promql import GPU_THROTTLE_SHARE, TCP_RETRANSMIT_RATIO, THROTTLE_SHARE_REASONS

N = 'cluster=~"$cluster", instance=~"$instance"'
G = N + ', gpu=~"$gpu"'
THROTTLED = f'reason=~"{THROTTLE_SHARE_REASONS}", {G}'
RATE = "[$__rate_interval]"
RECOVERY_ACTIONS = {
    0: ("none", "green"),
    1: ("GPU reset", "orange"),
    2: ("node reboot", "red"),
    3: ("drain peer-to-peer", "orange"),
    4: ("drain and reset", "red"),
}


def build() -> Any:
    variables = [
        cluster_variable(),
        query_variable("instance", "Node", 'label_values(fleetscope_build_info{cluster=~"$cluster"}, instance)',
                       multi=False, include_all=False),
        query_variable("gpu", "GPU", f"label_values(fleetscope_gpu_info{{{N}}}, gpu)", multi=True, include_all=True),
    ]
    summary = [
        stat_panel("GPUs visible", "none", ok("blue"), Q(f"sum(fleetscope_gpu_nvml_devices{{{N}}})")),
        stat_panel("GPUs lost by NVML", "none", rising(1, 1), Q(f"sum(fleetscope_gpu_lost{{{N}}}) or vector(0)")),
        stat_panel("Recovery action needed", "none", rising(1, 2), Q(f"max(fleetscope_gpu_recovery_action{{{N}}})"),
                   value_mappings=mappings(RECOVERY_ACTIONS),
                   description="The most severe recovery action any GPU of this node asks for (NVML)."),
        stat_panel("EFA devices", "none", ok("blue"), Q(f"sum(fleetscope_efa_devices{{{N}}})")),
        stat_panel("Ranks running here", "none", ok("blue"),
                   Q(f"count(fleetscope_training_rank_info{{{N}}}) or vector(0)")),
        stat_panel("Collectors failing", "none", rising(1, 1),
                   Q(f"count(fleetscope_collector_success{{{N}}} == 0) or vector(0)"),
                   description="fleetscope collectors whose last run failed (hardware present but unreadable)."),
    ]
    gpus = [
        timeseries_panel("GPU utilization", "percentunit", rising(0.95, 1.01),
                         Q(f"fleetscope_gpu_utilization_ratio{{{G}}}", "GPU {{gpu}}"), minimum=0, maximum=1,
                         description="Share of time a kernel was running (NVML); says nothing about how busy "
                                     "the SMs were."),
        timeseries_panel("SM and tensor-core activity", "percentunit", falling(0.2, 0.5),
                         Q(f"fleetscope_gpu_sm_active_ratio{{{G}}}", "GPU {{gpu}} SM"),
                         Q(f"fleetscope_gpu_tensor_active_ratio{{{G}}}", "GPU {{gpu}} tensor"), minimum=0, maximum=1,
                         description="GPM (Hopper and later). SM activity below 0.5 usually means an ineffective GPU."),
        timeseries_panel("Power", "watt", rising(600, 700),
                         Q(f"fleetscope_gpu_power_watts{{{G}}}", "GPU {{gpu}}")),
        timeseries_panel("Temperatures", "celsius", rising(80, 87),
                         Q(f"fleetscope_gpu_temperature_celsius{{{G}}}", "GPU {{gpu}} core"),
                         Q(f"fleetscope_gpu_memory_temperature_celsius{{{G}}}", "GPU {{gpu}} memory")),
        timeseries_panel("SM clock", "hertz", ok(),
                         Q(f'fleetscope_gpu_clock_hertz{{clock="sm", {G}}}', "GPU {{gpu}}")),
        timeseries_panel("Clock slowdown by reason", "percentunit", rising(0.05, 0.2),
                         # The slowdowns' share is recorded only above 0, the power cap's not at all: its
                         # counter gives it, and the GPU's own reasons fill in the zeros.
                         Q(f'sum by (gpu, reason) ({GPU_THROTTLE_SHARE}{{{THROTTLED}}})\nor\n'
                           f'sum by (gpu, reason) (rate(fleetscope_gpu_throttle_seconds_total'
                           f'{{reason="sw_power_cap", {G}}}{RATE}))\nor\n'
                           f"sum by (gpu, reason) (fleetscope_gpu_throttle_seconds_total{{{THROTTLED}}}) * 0\nor\n"
                           f"sum by (gpu, reason) (fleetscope_gpu_throttle_active{{{THROTTLED}}}) * 0",
                           "GPU {{gpu}} {{reason}}"),
                         minimum=0, stacked=True,
                         description="Share of time each GPU spent with its clocks lowered, "
                                     "by NVML clock-event reason."),
        timeseries_panel("Memory used", "bytes", ok(),
                         Q(f"fleetscope_gpu_memory_used_bytes{{{G}}}", "GPU {{gpu}}")),
        timeseries_panel("ECC errors and Xid events", "none", rising(1, 1),
                         Q(f"sum by (gpu, error_type) (increase(fleetscope_gpu_ecc_errors_total"
                           f'{{counter_type="volatile", {G}}}{RATE}))', "GPU {{gpu}} ECC {{error_type}}"),
                         Q(f"sum by (gpu, xid, action) (increase(fleetscope_gpu_xid_errors_total{{{G}}}{RATE}))",
                           "GPU {{gpu}} Xid {{xid}} ({{action}})"),
                         bars=True, description="New errors per interval: ECC (volatile counters) and Xid events."),
        table_panel("Row remapping", "none", rising(1, 1),
                    Q(f"fleetscope_gpu_remapped_rows{{{G}}}", table=True), width=12,
                    rename={"Value": "Remapped rows", "cause": "Cause"},
                    description="Remapped rows per GPU and cause; uncorrectable remaps need a GPU reset "
                                "to take effect."),
        table_panel("Row remap pending / failed", "none", rising(1, 1),
                    Q(f"fleetscope_gpu_row_remap_pending{{{G}}}", table=True),
                    Q(f"fleetscope_gpu_row_remap_failed{{{G}}}", table=True), width=12,
                    rename={"Value #A": "Pending (reset needed)", "Value #B": "Failed (RMA)"}),
    ]
    efa = [
        timeseries_panel("EFA throughput", "Bps", ok(),
                         Q(f"sum by (device) (rate(fleetscope_efa_tx_bytes_total{{{N}}}{RATE}))", "{{device}} tx"),
                         Q(f"sum by (device) (rate(fleetscope_efa_rx_bytes_total{{{N}}}{RATE}))", "{{device}} rx"),
                         width=6),
        # Beside EFA: the node's other fabric, GPU to GPU over NVLink (#38)
        timeseries_panel("NVLink throughput", "Bps", ok(),
                         Q(f'sum by (gpu) (rate({gpu_metrics.NVLINK_BYTES_TOTAL}{{{N}, direction="tx"}}{RATE}))',
                           "GPU {{gpu}} tx"),
                         Q(f'sum by (gpu) (rate({gpu_metrics.NVLINK_BYTES_TOTAL}{{{N}, direction="rx"}}{RATE}))',
                           "GPU {{gpu}} rx"),
                         width=6, description="Data bytes each GPU sent and received over NVLink (GPM's rates, or "
                                              "the driver's counters on GPUs without GPM)."),
        timeseries_panel("EFA retransmits", "pps", rising(1, 100),
                         Q(f"sum by (device) (rate(fleetscope_efa_retransmit_packets_total{{{N}}}{RATE}))",
                           "{{device}} retransmitted packets"),
                         Q(f"sum by (device) (rate(fleetscope_efa_retransmit_timeout_events_total{{{N}}}{RATE}))",
                           "{{device}} retransmit timeouts"), width=6),
        timeseries_panel("EFA drops and errors", "cps", rising(0.01, 1),
                         Q(f"sum by (device) (rate(fleetscope_efa_rx_drops_total{{{N}}}{RATE}))",
                           "{{device}} rx drops"),
                         Q(f"sum by (device) (rate(fleetscope_efa_rdma_read_work_request_errors_total{{{N}}}{RATE}) "
                           f"+ rate(fleetscope_efa_rdma_write_work_request_errors_total{{{N}}}{RATE}))",
                           "{{device}} RDMA errors"),
                         Q(f"sum by (device) (rate(fleetscope_efa_impaired_remote_connection_events_total"
                           f"{{{N}}}{RATE}))", "{{device}} impaired connections"), width=6),
    ]
    network = [
        timeseries_panel("NIC throughput", "Bps", ok(),
                         Q(f"rate(fleetscope_net_receive_bytes_total{{{N}}}{RATE})", "{{device}} rx"),
                         Q(f"rate(fleetscope_net_transmit_bytes_total{{{N}}}{RATE})", "{{device}} tx"), width=6),
        timeseries_panel("NIC errors and drops", "pps", rising(0.01, 1),
                         Q(f"rate(fleetscope_net_receive_errors_total{{{N}}}{RATE}) "
                           f"+ rate(fleetscope_net_transmit_errors_total{{{N}}}{RATE})", "{{device}} errors"),
                         Q(f"rate(fleetscope_net_receive_dropped_total{{{N}}}{RATE}) "
                           f"+ rate(fleetscope_net_transmit_dropped_total{{{N}}}{RATE})", "{{device}} dropped"),
                         width=6),
        timeseries_panel("ENA allowances exceeded", "pps", rising(0.01, 1),
                         Q(f"rate(fleetscope_ena_bw_in_allowance_exceeded_total{{{N}}}{RATE})", "{{device}} bw in"),
                         Q(f"rate(fleetscope_ena_bw_out_allowance_exceeded_total{{{N}}}{RATE})", "{{device}} bw out"),
                         Q(f"rate(fleetscope_ena_pps_allowance_exceeded_total{{{N}}}{RATE})", "{{device}} pps"),
                         Q(f"rate(fleetscope_ena_conntrack_allowance_exceeded_total{{{N}}}{RATE})",
                           "{{device}} conntrack"),
                         width=6,
                         description="Packets queued or dropped because an EC2 instance allowance was exceeded."),
        timeseries_panel("TCP retransmitted segments", "percentunit", rising(0.01, 0.05),
                         Q(f"{TCP_RETRANSMIT_RATIO}{{{N}}}", "retransmitted / sent"),
                         width=6),
    ]
    jobs = [
        table_panel("Ranks on this node", "none", ok(),
                    Q(f"fleetscope_training_last_step{{{N}}} * on (instance, training_job, rank) "
                      f"group_left (gpu, dp_rank, world_size) fleetscope_training_rank_info{{{N}}}", table=True),
                    Q(f"(time() - {exprs.last_step_stamp(N)}) "
                      f"* on (instance, training_job, rank) "
                      f"group_left (gpu, dp_rank, world_size) fleetscope_training_rank_info{{{N}}}", table=True),
                    width=24, links=[link("Training job", job_url("${__data.fields.training_job}"))],
                    rename={"Value #A": "Last step", "Value #B": "Since last step"},
                    column_units={"Since last step": "s"},
                    description="Ranks whose training steps this node's daemon receives; click a job to open it."),
    ]
    return build_dashboard(
        UID_NODE, "fleetscope / Node detail",
        "One node: per-GPU health and activity, EFA devices, NIC, ENA allowances, TCP, and the ranks it runs.",
        variables,
        [("Summary", summary), ("GPUs", gpus), ("EFA", efa), ("Host network", network), ("Jobs on this node", jobs)],
        annotations=[xid_annotation(G), alerts_annotation(N)],
    )
