"""PromQL the dashboards share that no recording rule provides, and how they show the verdicts.

Everything the rules decide (stragglers, their cause, goodput) the dashboards
read from the recording rules named in :mod:`fleetscope.promql`; this module
only holds what is a view: raw means over a dashboard's interval, colours and
the thresholds the panels colour by, taken from the production rule settings.
"""

from __future__ import annotations

from fleetscope.metrics import training
from fleetscope.promql import NODE_CLOCK_OFFSET, STRAGGLER_CAUSES
from fleetscope.rules.settings import PRODUCTION

# Colours of the stragglers' smoothed ratio: flagged from the rules' floor, critical at the NVRx score.
STRAGGLER_WARN = 1 + PRODUCTION.straggler_min_excess
STRAGGLER_CRIT = 1 / PRODUCTION.straggler_critical_score

CAUSE_COLOURS = {
    "gpu_xid": "red", "gpu_throttled": "orange", "input_wait": "yellow", "network": "purple",
    "host_cpu": "blue", "unknown": "text",
}


def cause_mappings() -> dict[str, tuple[str, str]]:
    """The verdict's ``cause`` label -> (words, colour), for a table column."""
    if set(CAUSE_COLOURS) != set(STRAGGLER_CAUSES):
        raise ValueError(f"cause colours {sorted(CAUSE_COLOURS)} differ from the causes {sorted(STRAGGLER_CAUSES)}")
    return {cause: (f"{cause}: {words}", CAUSE_COLOURS[cause]) for cause, words in STRAGGLER_CAUSES.items()}


def mean_step_seconds(matchers: str, by: str, window: str = "5m") -> str:
    """Mean step time over ranks: step seconds per step, both summed over the group."""
    return (
        f"sum by ({by}) (rate({training.STEP_SECONDS_TOTAL}{{{matchers}}}[{window}])) "
        f"/ sum by ({by}) (rate({training.STEPS_TOTAL}{{{matchers}}}[{window}]))"
    )


def last_step_stamp(matchers: str) -> str:
    """Each rank's last step time on Prometheus's clock: the node's stamp plus its offset, as the rules read it.

    ``time()`` minus a node's own stamp is off by the node's clock error, and after an NTP step by the step
    (600 s on a node stepped back): a healthy rank read minutes without a step."""
    return (f"({training.LAST_STEP_TIMESTAMP_SECONDS}{{{matchers}}} "
            f"+ on (instance) group_left () {NODE_CLOCK_OFFSET})")
