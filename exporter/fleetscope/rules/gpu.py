"""GPU rules: Xids by catalog action, lost or missing GPUs, memory errors, throttling, links, clocks."""

from __future__ import annotations

from fleetscope.metrics import MetricSpec
from fleetscope.metrics import gpu as gpu_metrics
from fleetscope.rules.model import Alert, Group, Record, held, new_or_increased, num, sel
from fleetscope.rules.settings import Settings
from fleetscope.signals import (
    GPU_BUSY,
    GPU_CLOCK_RATIO,
    GPU_THROTTLE_SHARE,
    NODE_GPU_UTILIZATION,
    SLOWDOWN_REASONS,
    THROTTLE_SHARE_REASONS,
)

GPU_LABELS = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"
# Per link at --collector.gpu.detail=all; the GPU's links together at the default level.
NVLINK = "{{ with $labels.link }}NVLink {{ . }}{{ else }}NVLink (one or more links){{ end }}"

# NVIDIA Xid catalog immediate-action classes (matched case-insensitively). Classes not
# listed here and not harmless (IGNORE, WORKFLOW_XID_45: a secondary report) need inspection.
XID_CLASSES: tuple[tuple[str, str, str, str], ...] = (
    ("GpuXidResetRequired", "critical", "RESET_GPU|WORKFLOW_XID_48",
     "The GPU must be reset (or the node drained and the GPU reset) before it runs work again."),
    ("GpuXidRebootRequired", "critical", "RESTART_BM|RESTART_VM",
     "The node must be rebooted; drain it first."),
    ("GpuXidNvlinkError", "critical", "WORKFLOW_NVLINK_ERR|WORKFLOW_NVLINK5_ERR",
     "An NVLink fault: drain the node, check NVLink state and the NVSwitch logs, then reset the GPUs."),
    ("GpuXidApplicationError", "info", "RESTART_APP",
     "The application on this GPU faulted and must be restarted; the GPU itself is usually healthy."),
)
HARMLESS_XID = "IGNORE|WORKFLOW_XID_45"


def _of_gpu(s: Settings, metric: MetricSpec) -> str:
    """An alert template that reads ``metric`` of the alert's GPU (its value, or ? when the series is gone)."""
    query = sel(s, metric, 'instance="%s", gpu="%s"')
    return f"{{{{ with printf `{query}` $labels.instance $labels.gpu | query }}}}{{{{ . | first | value }}}}" \
           "{{ else }}?{{ end }}"


def recording_rules(s: Settings) -> Group:
    sm_clock = held(s, gpu_metrics.CLOCK_HERTZ, 'clock="sm"')
    recorded_reasons = f'reason=~"{THROTTLE_SHARE_REASONS}"'
    return Group("fleetscope-gpu.rules", (
        # Share of time held down per reason. NVML counts time only for some reasons (not hw_slowdown);
        # for the others the sampled 0/1 state stands in. Only where above 0: the zeros were 40 recorded
        # series per p5 node (82k at 2,048 nodes) that every reader then went through.
        Record(GPU_THROTTLE_SHARE, (
            f"(\n"
            f"  rate({sel(s, gpu_metrics.THROTTLE_SECONDS_TOTAL, recorded_reasons)}[{s.rate_window}])\n"
            f"  or\n"
            f"  avg_over_time({sel(s, gpu_metrics.THROTTLE_ACTIVE, recorded_reasons)}[{s.rate_window}])\n"
            f") > 0"
        )),
        Record(GPU_CLOCK_RATIO, f"{sm_clock}\n  / on (instance) group_left\nquantile by (instance) (0.5, {sm_clock})"),
        Record(NODE_GPU_UTILIZATION, f"avg without (gpu, uuid) ({held(s, gpu_metrics.UTILIZATION_RATIO)})"),
        # SM activity (GPM, Hopper+) says whether kernels keep the SMs busy; utilization only that one ran.
        Record(GPU_BUSY, (
            f"avg_over_time({sel(s, gpu_metrics.SM_ACTIVE_RATIO)}[{s.rate_window}])\n"
            f"or\n"
            f"avg_over_time({sel(s, gpu_metrics.UTILIZATION_RATIO)}[{s.rate_window}])"
        )),
    ))


def alert_rules(s: Settings) -> Group:
    w = s.rate_window
    alerts: list[Alert] = []
    known = [HARMLESS_XID]
    for name, severity, actions, advice in XID_CLASSES:
        known.append(actions)
        xid = sel(s, gpu_metrics.XID_ERRORS_TOTAL, f'action=~"(?i)({actions})"')
        alerts.append(Alert(
            name, new_or_increased(s, xid, s.xid_window), severity,  # type: ignore[arg-type]
            "A GPU reported an Xid whose catalog action is " + actions.split("|")[0] + ".",
            f"{GPU_LABELS} reported Xid {{{{ $labels.xid }}}} (action {{{{ $labels.action }}}}) within the last "
            f"{s.xid_window}. {advice}",
        ))
    inspect = sel(s, gpu_metrics.XID_ERRORS_TOTAL, f'action!~"(?i)({"|".join(known)})"')
    alerts.append(Alert(
        "GpuXidNeedsInspection", new_or_increased(s, inspect, s.xid_window), "critical",
        "A GPU reported an Xid that needs hardware inspection or a vendor case.",
        f"{GPU_LABELS} reported Xid {{{{ $labels.xid }}}} (action {{{{ $labels.action }}}}) within the last "
        f"{s.xid_window}. Drain the node and follow the catalog action (mechanics, firmware, UVM or support).",
    ))
    nvml, pci, expected = (
        held(s, spec) for spec in (gpu_metrics.NVML_DEVICES, gpu_metrics.PCI_DEVICES, gpu_metrics.EXPECTED_DEVICES))
    node_pci = sel(s, gpu_metrics.PCI_DEVICES, 'instance="%s"')
    node_expected = sel(s, gpu_metrics.EXPECTED_DEVICES, 'instance="%s"')
    uncorrected = sel(s, gpu_metrics.ECC_ERRORS_TOTAL, 'error_type="uncorrected", counter_type="volatile"')
    alerts += [
        Alert(
            "GpuLost", f"{held(s, gpu_metrics.LOST)} == 1", "critical",
            "NVML lost a GPU.",
            f"{GPU_LABELS} is lost to NVML (fallen off the bus or not responding). Drain and reboot the node.",
            s.gpu_state_for,
        ),
        Alert(
            "GpuMissing", f"{nvml} < {pci}\nor\n{nvml} < {expected}", "critical",
            "A node has fewer usable GPUs than it should.",
            "NVML sees {{ $value }} GPUs on {{ $labels.instance }}"
            f"{{{{ with printf `{node_pci}` $labels.instance | query }}}}"
            "; the PCI bus shows {{ . | first | value }}{{ end }}"
            f"{{{{ with printf `{node_expected}` $labels.instance | query }}}}"
            "; {{ . | first | value }} are expected{{ end }}.",
            s.gpu_state_for,
        ),
        Alert(
            "GpuRecoveryActionRequired", f"{held(s, gpu_metrics.RECOVERY_ACTION)} > 0", "critical",
            "The driver asks for a recovery action on a GPU.",
            f"{GPU_LABELS} reports recovery action {{{{ $value }}}} "
            "(1 reset, 2 reboot, 3 drain P2P, 4 drain and reset).",
            s.gpu_state_for,
        ),
        Alert(
            "GpuUncorrectableEccError",
            f"increase({uncorrected}[{s.xid_window}]) > 0",
            "critical",
            "A GPU had uncorrectable ECC errors.",
            f"{GPU_LABELS} had {{{{ $value | humanize }}}} uncorrectable ECC errors in the last {s.xid_window}.",
        ),
        Alert(
            "GpuRowRemapFailed", f"{held(s, gpu_metrics.ROW_REMAP_FAILED)} == 1", "critical",
            "A GPU failed to remap a memory row.",
            f"{GPU_LABELS} failed a row remap: its memory cannot be repaired in the field. Replace the GPU (RMA).",
        ),
        Alert(
            "GpuRowRemapPending", f"{held(s, gpu_metrics.ROW_REMAP_PENDING)} == 1", "warning",
            "A GPU has a row remap pending until it is reset.",
            f"{GPU_LABELS} has a pending row remap; it takes effect at the next GPU reset.",
            s.gpu_state_for,
        ),
    ]
    corrected = sel(s, gpu_metrics.ECC_ERRORS_TOTAL, 'error_type="corrected", counter_type="volatile"')
    cw = s.ecc_corrected_window
    alerts += [
        Alert(
            "GpuCorrectableEccAccelerating",
            # Comparisons chained, not `and`-ed: the last window is read once (at fleet size the 1h windows are
            # the costliest reads of the rules).
            (
                f"(\n"
                f"  increase({corrected}[{cw}])\n"
                f"    > {num(s.ecc_corrected_growth)} * increase({corrected}[{cw}] offset {cw})\n"
                f") > {num(s.ecc_corrected_min_increase)}"
            ),
            "warning",
            "Correctable ECC errors on a GPU are accelerating.",
            f"{GPU_LABELS} had {{{{ $value | humanize }}}} correctable ECC errors in the last {cw}, more than "
            f"{num(s.ecc_corrected_growth)}x the {cw} before.",
        ),
        Alert(
            "GpuThrottled",
            f'{GPU_THROTTLE_SHARE}{{reason=~"{SLOWDOWN_REASONS}"}} > {num(s.throttle_share)}',
            "warning",
            "A GPU is throttled by temperature, HW slowdown or power brake.",
            f"{GPU_LABELS} spent {{{{ $value | humanizePercentage }}}} of the last {w} in clock event "
            "{{ $labels.reason }}.",
            s.throttle_for,
        ),
        Alert(
            "GpuTemperatureNearSlowdown",
            (
                f"{held(s, gpu_metrics.TEMPERATURE_CELSIUS)}\n"
                f"  >=\n"
                f"{held(s, gpu_metrics.SLOWDOWN_TEMPERATURE_CELSIUS)} - {num(s.temperature_margin_celsius)}"
            ),
            "warning",
            "A GPU runs close to its slowdown temperature.",
            f"{GPU_LABELS} is at {{{{ $value }}}} C, within {num(s.temperature_margin_celsius)} C of its slowdown "
            "temperature.",
            s.temperature_for,
        ),
        Alert(
            "GpuPcieReplaysHigh",
            f"rate({sel(s, gpu_metrics.PCIE_REPLAYS_TOTAL)}[{w}]) > {num(s.pcie_replays_per_second)}",
            "warning",
            "A GPU's PCIe link replays packets at a high rate.",
            f"{GPU_LABELS} replays {{{{ printf \"%.2f\" $value }}}} PCIe packets per second "
            f"(threshold {num(s.pcie_replays_per_second)}).",
            s.pcie_for,
        ),
        Alert(
            "GpuPcieLinkDowntrained",
            (
                f"(\n"
                f"  {held(s, gpu_metrics.PCIE_LINK_GENERATION)} < {held(s, gpu_metrics.PCIE_LINK_MAX_GENERATION)}\n"
                f"  or\n"
                f"  {held(s, gpu_metrics.PCIE_LINK_WIDTH)} < {held(s, gpu_metrics.PCIE_LINK_MAX_WIDTH)}\n"
                f")\n"
                f"and on (instance, gpu)\n"
                f"{held(s, gpu_metrics.UTILIZATION_RATIO)} > {num(s.pcie_downtrain_busy_ratio)}"
            ),
            "warning",
            "A busy GPU's PCIe link runs below its maximum generation or width.",
            f"{GPU_LABELS} runs its PCIe link at Gen {_of_gpu(s, gpu_metrics.PCIE_LINK_GENERATION)} "
            f"x{_of_gpu(s, gpu_metrics.PCIE_LINK_WIDTH)} while busy; link and host allow Gen "
            f"{_of_gpu(s, gpu_metrics.PCIE_LINK_MAX_GENERATION)} x{_of_gpu(s, gpu_metrics.PCIE_LINK_MAX_WIDTH)}.",
            s.pcie_downtrain_for,
        ),
        Alert(
            "GpuNvlinkErrors",
            f"rate({sel(s, gpu_metrics.NVLINK_ERRORS_TOTAL)}[{w}]) > {num(s.nvlink_errors_per_second)}",
            "warning",
            "A GPU's NVLink reports errors.",
            f"{GPU_LABELS} {NVLINK} counts {{{{ printf \"%.2f\" $value }}}} "
            "{{ $labels.error }} errors per second.",
            s.nvlink_for,
        ),
        Alert(
            "GpuNvlinkDown", f"{held(s, gpu_metrics.NVLINK_UP)} == 0", "critical",
            "An NVLink of a GPU is down.",
            f"{GPU_LABELS} {NVLINK} is down.",
            s.nvlink_down_for,
        ),
        Alert(
            "GpuSmClockBelowPeers",
            (
                f"{GPU_CLOCK_RATIO} < {num(s.clock_peer_ratio)}\n"
                f"and on (instance, gpu)\n"
                f"{held(s, gpu_metrics.UTILIZATION_RATIO)} > {num(s.clock_busy_ratio)}"
            ),
            "warning",
            "A busy GPU's SM clock sits well below its peers on the node.",
            f"{GPU_LABELS} runs its SM clock at {{{{ $value | humanizePercentage }}}} of the node's median while busy "
            f"(threshold {num(s.clock_peer_ratio * 100)}%).",
            s.clock_for,
        ),
    ]
    return Group("fleetscope-gpu", tuple(alerts))
