"""Thresholds, windows and the target selector: the one place rules are tuned.

``Settings()`` is the production preset. ``E2E`` compresses every window and
``for:`` so the end-to-end simulation (scrape interval 5s) can make each alert
fire within a few minutes; the thresholds stay the same so the simulation
exercises the production logic, only faster.

Operators tune them without Python through a values file of setting names
(``fleetscope rules --values tuning.yaml``, like a monitoring mixin's
``_config``): :func:`with_values` applies one to a preset.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from fleetscope.check.verdicts import BREAKER_PERCENT

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# Where the shipped rules' runbook_url points: absolute, so a link in an Alertmanager, Slack or PagerDuty
# notification opens (a relative path resolves against nothing there). Sites with their own copy of the
# runbooks set runbook_base_url.
RUNBOOK_BASE_URL = "https://github.com/fleetscope/fleetscope/blob/main/docs/runbooks.md"


def seconds(duration: str) -> float:
    """A single-unit Prometheus duration (``90s``, ``5m``, ``1h``) in seconds."""
    match = _DURATION.match(duration)
    if not match:
        raise ValueError(f"expected a Prometheus duration such as 30s, 5m or 1h, got {duration!r}")
    return int(match.group(1)) * _SECONDS[match.group(2)]


@dataclass(frozen=True)
class Settings:
    # Which scrape targets are fleetscope daemons (node-mixin style: stacks name the job differently).
    selector: str = 'job="fleetscope"'
    # Base of every runbook_url (absolute: notifications cannot resolve a relative link); the anchor is the
    # lower-cased alert name.
    runbook_base_url: str = RUNBOOK_BASE_URL
    # Rule evaluation interval for every group; empty keeps Prometheus's global setting.
    evaluation_interval: str = ""
    # Window for rate()/increase() of the event counters (EFA events and errors, push rejections): an event
    # keeps its alert's condition true this long.
    rate_window: str = "5m"
    # Window of the shares and rates (throttle and busy share, data and communication share, interface error
    # ratios, EFA and TCP rates, PCIe replays, NVLink errors, ENA allowance shaping): each is read once a round
    # for every GPU, rank or interface of the fleet, so its samples are most of what the rules read. 2m holds 4
    # scrapes at 30s (8 at 15s) and every alert on them waits a for: of 10m or more.
    share_window: str = "2m"
    # Evaluation interval of the training groups (stragglers, their cause, the training alerts), whatever the
    # global one: the straggler rule's time to detect is measured at it (docs/runbooks.md). Empty: global.
    training_evaluation_interval: str = "30s"
    # Evaluation interval of the dense per-GPU and per-rank records (GPU shares, a job's pace): what the
    # straggler cause reads of them is up to this old, which the old 5m windows also were on average.
    # Empty: global.
    record_evaluation_interval: str = "2m"
    # Evaluation interval of the alert groups whose every alert waits a for: of 5m or more (GPU degradation, the
    # network, a job's pace, fleetscope itself), of the network's records (read by those alerts, the straggler
    # cause's network evidence, which lasts minutes, and dashboards) and of goodput (dashboards only): an alert
    # fires up to one interval after its for:, for a third of the reads of a 1m evaluation. Empty: global.
    slow_evaluation_interval: str = "3m"
    # A failed scrape marks all of its target's series stale. Raw series read at an instant are held this
    # long (last_over_time) so one missed scrape neither restarts a pending for: nor resolves an alert: at
    # least twice the scrape interval (1m covers the shipped 15s and 30s; set 2m for 60s scrapes). Every
    # alert keeps firing keep_firing_for after its condition last held (Prometheus 2.42+,
    # prometheus-operator 0.65+; empty leaves the field out for older rulers).
    scrape_gap_window: str = "1m"
    keep_firing_for: str = "2m"

    # Training stragglers: evidence that accumulates (docs/runbooks.md#trainingstragglerrank). Every
    # straggler_sample_window (the evaluation interval of the straggler records) each rank's mean compute time per
    # step over that window, over its pipeline stage's median of the same, is one sample (1.0 = typical). A rank
    # is flagged when the lower confidence bound on the median of its samples, over straggler_short_window or
    # straggler_window (the larger bound), median - straggler_confidence x 1.2533 x sigma / sqrt(n), exceeds
    # 1 + the larger of straggler_min_excess and the job's robust spread (1.4826 x MAD of the window medians, less
    # their median standard error: the spread of ranks that really differ, not the medians' own noise) times
    # (sqrt(2 ln N) + straggler_spread_margin); sigma pools the rank's own SD of its samples with its
    # job's median SD (their quadratic mean); a window needs straggler_min_samples samples. So a persistent 2%
    # is named in minutes, a burst that spans fewer than half a short window's samples never (it moves the
    # median of none), and jitter widens the bound rather than moving the median.
    straggler_sample_window: str = "1m"
    straggler_short_window: str = "4m"
    straggler_window: str = "10m"
    straggler_min_samples: float = 4.0
    straggler_confidence: float = 2.5  # standard errors below the median (one-sided 0.6%); the floor does the rest
    straggler_min_excess: float = 0.01  # healthy real ranks' window medians stay within ~0.2% of their stage's
    straggler_spread_margin: float = 1.5  # robust SDs beyond the expected largest healthy rank
    straggler_spread_min_ranks: float = 3.0  # fewer ranks than this: no spread estimate, the floor alone
    straggler_for: str = "1m"
    straggler_critical_score: float = 0.75  # stage median / rank median (NVRx default threshold)
    straggler_critical_for: str = "5m"
    straggler_node_fraction: float = 0.5  # more than this share of a node's ranks slow -> the node
    slowdown_ratio: float = 1.10  # job median step time vs its own baseline; never below 1.03 (diurnal 1-2%)
    slowdown_window: str = "15m"
    slowdown_baseline_offset: str = "1h"
    slowdown_for: str = "15m"
    # Hangs (docs/runbooks.md#trainingjobhang). A rank outside a collective (data, compute, idle) that most of
    # its job's ranks wait for in one (hang_awaited_share of those that report) is named once its node's last
    # scrape saw it there for hang_awaited_step_multiple x the job's median step time, and at least
    # hang_awaited_min_seconds (a rank that has not completed a step in its process yet, or in a phase of the
    # job's own naming, never). 15 s: at 15 s scrapes and evaluations, the next scrape, the recording group and
    # the alert group add up to 45 s more, so a hung rank is named within 60 s of its stall.
    hang_awaited_step_multiple: float = 2.0
    hang_awaited_min_seconds: float = 15.0
    hang_awaited_share: float = 0.5
    # Otherwise a job is hung after no step for hang_step_multiple x its median step time, clamped...
    hang_step_multiple: float = 10.0  # DLRover: 10x the typical step time...
    hang_min_seconds: float = 120.0  # ...clamped to [2 min, 30 min]
    hang_max_seconds: float = 1800.0
    # ...or after hang_pause_seconds while it pauses: a rank in a phase of the job's own naming (a declared
    # checkpoint), every rank in the same phase of its own work or between steps (a checkpoint, an evaluation,
    # a recompilation; not every rank waiting for data), or a rank restarted and not through a step yet.
    hang_pause_seconds: float = 1800.0
    # Every path above is a duration measured from the ranks' own timestamps at each evaluation: no for:.
    hang_for: str = ""
    # The progress groups' evaluation interval, whatever the global one: the hang's time to name its rank
    # is measured at it (docs/runbooks.md). Empty: global.
    progress_evaluation_interval: str = "15s"
    silent_after_seconds: float = 120.0  # a rank with no push for this long while others push
    # A rank is judged on its pace (stragglers, shares, slowdown, goodput) only while it runs: not ended, its
    # process not gone, and a report newer than this (reports come every second; this covers a missed 30 s
    # scrape). A job none of whose ranks runs raises none of those alerts; a firing one resolves.
    running_report_seconds: float = 60.0
    silent_for: str = "1m"
    dead_for: str = "1m"  # a rank's process gone without a goodbye (the daemon saw it go)
    input_warning_share: float = 0.05  # PyTorch profiler's input-bound rule
    input_critical_share: float = 0.15
    input_for: str = "10m"
    comm_share: float = 0.25  # exposed communication share of the step (no source gives a number)
    comm_for: str = "15m"
    low_activity_ratio: float = 0.5  # DCGM: SM activity < 0.5 "likely ineffective"
    low_activity_for: str = "30m"

    # NCCL Inspector: the rank that arrives last at its collectives, and bus-bandwidth collapse.
    nccl_late_ratio: float = 0.8  # collective time below this share of the communicator median's...
    nccl_late_wait_share: float = 0.05  # ...and its peers wait for it at least this share of their time
    nccl_late_for: str = "15m"
    nccl_bandwidth_ratio: float = 0.5  # delivered bus bandwidth below half its own recent average
    nccl_bandwidth_window: str = "15m"
    nccl_bandwidth_baseline_offset: str = "1h"
    nccl_bandwidth_for: str = "10m"

    # GPU.
    throttle_share: float = 0.25  # share of time in a thermal / HW slowdown / power-brake clock event
    throttle_for: str = "10m"
    temperature_margin_celsius: float = 5.0  # warn this close to the slowdown temperature
    temperature_for: str = "5m"
    pcie_replays_per_second: float = 0.1
    pcie_for: str = "15m"
    # A PCIe link below its maximum generation or width while its GPU is busier than this, for pcie_downtrain_for,
    # has trained down (an idle GPU lowers its link speed on purpose, so only a busy one counts).
    pcie_downtrain_busy_ratio: float = 0.5
    pcie_downtrain_for: str = "10m"
    nvlink_errors_per_second: float = 0.0  # any sustained error growth
    nvlink_for: str = "10m"
    nvlink_down_for: str = "5m"
    ecc_corrected_window: str = "1h"  # correctable ECC accelerating: this window vs the one before
    ecc_corrected_min_increase: float = 10.0
    ecc_corrected_growth: float = 2.0
    clock_peer_ratio: float = 0.85  # SM clock below this share of the node's median under load
    clock_busy_ratio: float = 0.5
    clock_for: str = "10m"
    xid_window: str = "10m"  # how long an immediate Xid alert stays active after the event
    gpu_state_for: str = "1m"  # GPU lost, recovery action, row remap pending
    # A GPU not registered with the NVLink fabric this long (Fabric Manager registers a GPU within seconds of the
    # driver loading; the state is read every slow interval, 60 s by default), or whose registration failed.
    fabric_for: str = "5m"
    # A whole GPU the kubelet allocated to a pod (--gpu.pod-resources-socket) and busy (SM activity, else
    # utilization, over share_window) below this share for allocated_idle_for: capacity held and wasted.
    allocated_idle_ratio: float = 0.05
    allocated_idle_for: str = "1h"

    # EFA and network.
    efa_missing_for: str = "5m"
    efa_rx_drops_per_second: float = 1.0
    efa_event_for: str = "10m"
    efa_retransmit_cause_per_second: float = 100.0  # SRD retransmits worth naming as a straggler cause
    ena_allowance_per_second: float = 1.0  # packets shaped per second
    ena_for: str = "10m"
    tcp_retransmit_ratio: float = 0.01
    tcp_for: str = "15m"
    interface_error_ratio: float = 0.01  # node-mixin's NodeNetworkReceiveErrs threshold
    interface_for: str = "15m"

    # fleetscope itself.
    down_for: str = "5m"
    collector_failing_for: str = "10m"
    push_rejected_per_second: float = 0.0
    push_rejected_for: str = "10m"

    # The straggler cause verdict (first match wins): an Xid on the rank's GPU within cause_xid_window;
    # its GPU held down (thermal, HW slowdown, power brake) for cause_throttle_share of the time or its SM
    # clock below cause_clock_ratio of its node's median; its own data wait above input_warning_share; EFA
    # retransmits above efa_retransmit_cause_per_second, EFA drops above efa_rx_drops_per_second, EFA
    # error events or ENA allowance shaping above ena_allowance_per_second on its node; its GPU busy below
    # cause_gpu_busy_ratio of the job's median GPU (the host does not feed it); else unknown.
    cause_xid_window: str = "1h"
    cause_throttle_share: float = 0.1
    cause_clock_ratio: float = 0.9
    cause_gpu_busy_ratio: float = 0.9

    # Goodput: GPU-seconds lost per job, against its best sustained step time (the lowest median of its
    # step time over goodput_sustain_window, within goodput_best_window). A job whose newest step is older
    # than goodput_stall_multiple x that best step time is stalled (hang, checkpoint, restart).
    goodput_sustain_window: str = "10m"
    goodput_best_window: str = "24h"
    goodput_stall_multiple: float = 3.0

    # Repeat offenders: a node whose ranks were flagged slow in repeat_min_count distinct jobs, or in as
    # many separate windows (flags less than repeat_gap apart merge), within repeat_window. Evaluated
    # every repeat_interval: the 7-day look-back need not run at every evaluation.
    repeat_window: str = "7d"
    repeat_gap: str = "1h"
    repeat_min_count: float = 3.0
    repeat_interval: str = "10m"

    # The circuit breaker (fleetscope.check.verdicts): `fleetscope check` holds back a cross-node finding that
    # more than breaker_percent of a cluster's nodes carried within breaker_window, and
    # FleetscopeBreakerTripped says so. Keep them equal to check.breaker-percent and check.breaker-window.
    breaker_percent: float = BREAKER_PERCENT
    breaker_window: str = "10m"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            is_duration = f.name.endswith(("_for", "_window", "_offset", "_gap", "_interval"))
            if is_duration and isinstance(value, str) and value:
                seconds(value)
        if not 0 < self.nccl_late_ratio < 1 or not 0 < self.nccl_bandwidth_ratio < 1:
            raise ValueError("nccl_late_ratio and nccl_bandwidth_ratio are shares of a typical value, in (0, 1)")
        if self.slowdown_ratio < 1.03:
            raise ValueError("slowdown_ratio below 1.03 alerts on diurnal swings (1-2%)")
        if not 0 < self.straggler_critical_score < 1 / (1 + self.straggler_min_excess):
            raise ValueError("straggler_critical_score must flag ranks slower than the warning threshold")
        if self.straggler_min_excess < 0.005:
            raise ValueError("straggler_min_excess below 0.005 flags healthy ranks (their persistent spread is ~0.2%)")
        if not 0 < self.breaker_percent <= 100:
            raise ValueError("breaker_percent is a share of the cluster's nodes, in (0, 100]")
        if not self.hang_min_seconds <= self.hang_max_seconds:
            raise ValueError("hang_min_seconds must not exceed hang_max_seconds")
        if not 0 < self.hang_awaited_share <= 1:
            raise ValueError("hang_awaited_share is a share of a job's ranks, in (0, 1]")


PRODUCTION = Settings()

# Time-compressed preset for the end-to-end simulation: scrape every 5s, rate windows of 1m,
# for: of 30s-1m, hang clamp [30s, 5m], baseline 3m back, look-backs of 2m. Thresholds are unchanged.
E2E = dataclasses.replace(
    PRODUCTION,
    evaluation_interval="5s",
    training_evaluation_interval="5s",
    record_evaluation_interval="5s",
    slow_evaluation_interval="5s",
    scrape_gap_window="15s",
    keep_firing_for="15s",
    rate_window="1m",
    share_window="1m",
    straggler_sample_window="15s",
    straggler_short_window="1m",
    straggler_window="2m",
    straggler_min_samples=4.0,
    straggler_for="30s",
    straggler_critical_for="30s",
    slowdown_window="1m",
    slowdown_baseline_offset="3m",
    slowdown_for="30s",
    nccl_late_for="1m",
    nccl_bandwidth_window="1m",
    nccl_bandwidth_baseline_offset="3m",
    nccl_bandwidth_for="30s",
    hang_min_seconds=30.0,
    hang_max_seconds=300.0,
    hang_pause_seconds=300.0,
    progress_evaluation_interval="5s",
    silent_after_seconds=30.0,
    running_report_seconds=15.0,
    silent_for="10s",
    dead_for="10s",
    input_for="30s",
    comm_for="1m",
    low_activity_for="1m",
    throttle_for="30s",
    temperature_for="30s",
    pcie_for="30s",
    pcie_downtrain_for="30s",
    nvlink_for="30s",
    nvlink_down_for="30s",
    ecc_corrected_window="2m",
    clock_for="30s",
    xid_window="2m",
    gpu_state_for="10s",
    fabric_for="30s",
    allocated_idle_for="1m",
    efa_missing_for="30s",
    efa_event_for="30s",
    ena_for="30s",
    tcp_for="1m",
    interface_for="1m",
    down_for="30s",
    collector_failing_for="30s",
    push_rejected_for="30s",
    cause_xid_window="2m",
    goodput_sustain_window="30s",
    goodput_best_window="2m",
    repeat_window="2m",
    repeat_gap="20s",
    repeat_interval="5s",
    breaker_window="1m",
)

PRESETS: dict[str, Settings] = {"production": PRODUCTION, "e2e": E2E}


class SettingsError(ValueError):
    """A values file or ``--set`` names no setting, gives one the wrong type, or an unusable value (one line)."""


def with_values(base: Settings, values: Mapping[str, object], source: str = "values") -> Settings:
    """``base`` with the settings ``values`` names (keys are :class:`Settings` field names).

    Thresholds take numbers; windows, ``for:`` durations, the selector and the runbook base URL take strings.
    Anything else raises :class:`SettingsError` naming ``source`` and the key.
    """
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    changes: dict[str, object] = {}
    for key, value in values.items():
        if not isinstance(key, str) or key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SettingsError(f"{source}: unknown setting {key!r}{hint}")
        if isinstance(getattr(base, key), float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SettingsError(f"{source}: {key} takes a number, got {value!r}")
            changes[key] = float(value)
        else:
            if not isinstance(value, str):
                raise SettingsError(f"{source}: {key} takes a string (a duration such as 5m, or text), got {value!r}")
            changes[key] = value
    try:
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SettingsError(f"{source}: {exc}") from None


def values_of(settings: Settings, base: Settings = PRODUCTION) -> dict[str, object]:
    """The settings that differ from ``base``, as a values mapping (:func:`with_values` reverses it)."""
    return {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(Settings)
        if getattr(settings, f.name) != getattr(base, f.name)
    }
