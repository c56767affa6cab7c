"""GPU rules: Xids by catalog action, lost or missing GPUs, memory errors, throttling, links, clocks."""

from __future__ import annotations

from fleetscope.metrics import MetricSpec
from fleetscope.metrics import gpu as gpu_metrics
from fleetscope.promql import (
    GPU_BUSY,
    GPU_CLOCK_RATIO,
    GPU_THROTTLE_SHARE,
    SLOWDOWN_REASONS,
)
from fleetscope.rules.model import Alert, Group, Record, held, new_or_increased, num, sel
from fleetscope.rules.settings import Settings, seconds

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


def at(s: Settings, selector: str, ago: str = "") -> str:
    """A counter's value now, or ``ago``, held over a missed scrape (``last_over_time`` over the gap window)."""
    return f"last_over_time({selector}[{s.scrape_gap_window}]{f' offset {ago}' if ago else ''})"


def duration(value: float) -> str:
    """Seconds as the shortest Prometheus duration (7200 -> 2h)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{int(value)}s"


def clock_ratio(s: Settings) -> str:
    """A GPU's SM clock over its node's median, for the GPUs below the higher of the two thresholds that read it
    (the straggler cause, the alert) only."""
    sm_clock = held(s, gpu_metrics.CLOCK_HERTZ, 'clock="sm"')
    below = max(s.cause_clock_ratio, s.clock_peer_ratio)
    return (
        f"{sm_clock}\n  / on (cluster, instance) group_left\n"
        f"quantile by (cluster, instance) (0.5, {sm_clock})\n  < {num(below)}"
    )


def recording_rules(s: Settings) -> list[Group]:
    recorded_reasons = f'reason=~"{SLOWDOWN_REASONS}"'
    w = s.share_window
    # Share of time held down per slowdown reason. NVML counts time only for some reasons (not hw_slowdown); for
    # the others the sampled 0/1 state stands in. Only where above 0: the zeros were 40 recorded series per p5
    # node (82k at 2,048 nodes) that every reader then went through.
    throttle = Record(GPU_THROTTLE_SHARE, (
        f"(\n"
        f"  rate({sel(s, gpu_metrics.THROTTLE_SECONDS_TOTAL, recorded_reasons)}[{w}])\n"
        f"  or\n"
        f"  avg_over_time({sel(s, gpu_metrics.THROTTLE_ACTIVE, recorded_reasons)}[{w}])\n"
        f") > 0"
    ))
    # SM activity (GPM, Hopper+) says whether kernels keep the SMs busy; utilization only that one ran.
    busy = Record(GPU_BUSY, (
        f"avg_over_time({sel(s, gpu_metrics.SM_ACTIVE_RATIO)}[{w}])\n"
        f"or\n"
        f"avg_over_time({sel(s, gpu_metrics.UTILIZATION_RATIO)}[{w}])"
    ))
    # At record_evaluation_interval: their windows are as long, and every alert on them waits 10m or more; the
    # straggler cause reads them as they were up to one interval ago, as it read 5m windows before. A group each:
    # none reads another, and each reads every GPU's window (0.5-0.9 s an evaluation at 2,048 nodes; a group's
    # rules run one after another, groups side by side).
    return [
        Group(name, (record,), interval=s.record_evaluation_interval)
        for name, record in (
            ("fleetscope-gpu-throttle.rules", throttle),
            ("fleetscope-gpu-clock.rules", Record(GPU_CLOCK_RATIO, clock_ratio(s))),
            ("fleetscope-gpu-busy.rules", busy),
        )
    ]


def alert_rules(s: Settings) -> list[Group]:
    """Xids, lost and missing GPUs, row remaps; and uncorrectable ECC errors in a group of its own (four held reads
    per GPU). Both at the global interval; a group's rules run one after another, groups side by side."""
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
            # The last branch is a node where NVML cannot even load (no fleetscope_gpu_nvml_devices): a driver
            # that failed to load shows as no GPU on the bus, or fewer than the expected count.
            "GpuMissing", f"{nvml} < {pci}\nor\n{nvml} < {expected}\nor\n{pci} < {expected}", "critical",
            "A node has fewer usable GPUs than it should.",
            "{{ $value }} GPUs usable on {{ $labels.instance }}"
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
        Alert(  # no for: a missed scrape delays it by one scrape, keep_firing_for holds it once it fires
            "GpuRowRemapFailed", f"{sel(s, gpu_metrics.ROW_REMAP_FAILED)} == 1", "critical",
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
    ecc = [
        Alert(
            "GpuUncorrectableEccError",
            # The counter against itself xid_window ago, each end held over a missed scrape: short reads per GPU
            # instead of the window's every sample. A series without that end (younger than xid_window: a new
            # node or GPU, or a scrape gap then) fires on any count at once, not once it is xid_window old:
            # counts since the driver loaded, which leave a row remap pending until the GPU is reset. Errors
            # within xid_window after a driver reload (the volatile counter restarts at 0) show once the reload
            # is that long ago; the reset never fires.
            f"{at(s, uncorrected)} - {at(s, uncorrected, s.xid_window)} > 0\nor\n"
            f"(\n  {at(s, uncorrected)} > 0\n    unless\n  {at(s, uncorrected, s.xid_window)}\n)",
            "critical",
            "A GPU had uncorrectable ECC errors.",
            f"{GPU_LABELS} had {{{{ $value | humanize }}}} uncorrectable ECC errors in the last {s.xid_window}.",
        ),
    ]
    allocation = sel(s, gpu_metrics.ALLOCATION_INFO, 'resource="nvidia.com/gpu"')
    alerts.append(Alert(
        # Whole GPUs only: NVML reports no utilization for a MIG GPU, so a MIG device's idleness is unknown here.
        "GpuAllocatedIdle",
        f"max by (cluster, instance, gpu, uuid, pod, namespace, container) ({allocation})\n"
        f"  * on (cluster, instance, gpu) group_left ()\n"
        f"max by (cluster, instance, gpu) ({GPU_BUSY})\n  < {num(s.allocated_idle_ratio)}",
        "warning",
        "A GPU allocated to a pod has been idle for a long time: capacity held and wasted.",
        f"{GPU_LABELS} is allocated to pod {{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}} (container "
        f"{{{{ $labels.container }}}}) and was {{{{ $value | humanizePercentage }}}} busy, below "
        f"{num(s.allocated_idle_ratio)}, for {s.allocated_idle_for}.",
        s.allocated_idle_for,
    ))
    return [Group("fleetscope-gpu", tuple(alerts)), Group("fleetscope-gpu-ecc", tuple(ecc)),
            Group("fleetscope-gpu-fabric", fabric_alerts(s))]


def fabric_alerts(s: Settings) -> tuple[Alert, ...]:
    """A GPU on an NVSwitch board that Fabric Manager has not registered (or failed to) cannot run CUDA (error 802)
    while every gauge looks healthy. State 0 (no NVSwitch fabric) and no state at all are never a fault."""
    state = held(s, gpu_metrics.FABRIC_STATE)
    return (
        Alert(
            "GpuFabricNotRegistered", f"{state} == 1\nor\n{state} == 2", "critical",
            "A GPU is not registered with the NVLink fabric: CUDA cannot use it.",
            f"{GPU_LABELS} has not completed its NVLink fabric registration (state {{{{ $value }}}}: 1 not started, "
            f"2 in progress) for {s.fabric_for}. Is nvidia-fabricmanager running on the node?",
            s.fabric_for,
        ),
        Alert(
            "GpuFabricRegistrationFailed", f"{held(s, gpu_metrics.FABRIC_STATUS)} != 0", "critical",
            "A GPU's NVLink fabric registration failed: CUDA cannot use it.",
            f"{GPU_LABELS} completed its NVLink fabric registration with NVML error {{{{ $value }}}} "
            "(nvmlReturn_t). See the Fabric Manager log.",
            s.gpu_state_for,
        ),
    )


# The degradation alerts by part of the GPU, a group each: a group's rules are evaluated one after another and
# groups side by side, and together they took 2.3 s an evaluation at 2,048 nodes (docs/benchmarks-fleet.md).
DEGRADATION_GROUPS = {
    "fleetscope-gpu-ecc-trend": ("GpuCorrectableEccAccelerating",),
    "fleetscope-gpu-clocks": ("GpuThrottled", "GpuTemperatureNearSlowdown", "GpuSmClockBelowPeers"),
    "fleetscope-gpu-pcie": ("GpuPcieReplaysHigh", "GpuPcieLinkDowntrained"),
    "fleetscope-gpu-nvlink": ("GpuNvlinkErrors", "GpuNvlinkDown"),
}


def degradation_rules(s: Settings) -> list[Group]:
    """A GPU that works but slower or less reliably: every alert waits a for: of 5m or more (or reads hours), so
    the groups are evaluated at ``slow_evaluation_interval``."""
    w = s.share_window
    alerts: list[Alert] = []
    corrected = sel(s, gpu_metrics.ECC_ERRORS_TOTAL, 'error_type="corrected", counter_type="volatile"')
    cw = s.ecc_corrected_window
    cw2 = duration(2 * seconds(cw))
    alerts += [
        Alert(
            "GpuCorrectableEccAccelerating",
            # Differences of the counter an hour apart, each end held over a missed scrape: short reads per GPU,
            # where increase() over two 1h windows read every sample of both hours (at fleet size the costliest
            # reads of all the rules). An hour that spans a driver reload (volatile counters restart at 0)
            # counts as 0.
            (
                f"(\n"
                f"  {at(s, corrected)}\n"
                f"    - {at(s, corrected, cw)}\n"
                f"  > {num(s.ecc_corrected_growth)} * clamp_min(\n"
                f"    {at(s, corrected, cw)}\n"
                f"      - {at(s, corrected, cw2)},\n"
                f"    0\n"
                f"  )\n"
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
    by_name = {alert.alert: alert for alert in alerts}
    assert sorted(by_name) == sorted(n for names in DEGRADATION_GROUPS.values() for n in names)
    return [Group(group, tuple(by_name[name] for name in names), interval=s.slow_evaluation_interval)
            for group, names in DEGRADATION_GROUPS.items()]
