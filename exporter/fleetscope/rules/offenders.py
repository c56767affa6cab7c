"""Repeat offenders: nodes whose ranks are flagged slow again and again, for taking them out of the pool.

MegaScale found about 0.5% of machines running about 10% slower, consistently
across runs: a machine, not a job. A node counts as a repeat offender when its
ranks were flagged (the straggler rule's flag, :data:`fleetscope.promql.STRAGGLERS`)
in ``repeat_min_count`` distinct jobs, or in as many separate windows, within
``repeat_window``; flags less than ``repeat_gap`` apart are one window, so a
rank hovering at the threshold is not counted twice. The look-back is long, so
this group runs every ``repeat_interval``, not at every evaluation; its counts
do not depend on that interval.
"""

from __future__ import annotations

from fleetscope.promql import (
    NODE_JOB_STRAGGLERS,
    NODE_STRAGGLER_FLAGGED,
    NODE_STRAGGLER_JOBS,
    NODE_STRAGGLER_WINDOWS,
)
from fleetscope.rules.model import Alert, Group, Record, num, sel
from fleetscope.rules.settings import Settings

NODE = "cluster, instance"


def rules(s: Settings) -> Group:
    window, count = s.repeat_window, num(s.repeat_min_count)
    node = "{{ $labels.instance }}"
    jobs = f"{{{{ with printf `{NODE_STRAGGLER_JOBS}{{instance=\"%s\"}}` $labels.instance | query }}}}" \
        "{{ . | first | value }}{{ else }}0{{ end }}"
    windows = f"{{{{ with printf `{NODE_STRAGGLER_WINDOWS}{{instance=\"%s\"}}` $labels.instance | query }}}}" \
        "{{ . | first | value }}{{ else }}0{{ end }}"
    flagged = (
        f"(count by ({NODE}) (max_over_time({NODE_JOB_STRAGGLERS}[{s.repeat_gap}])) > 0) * 0 + 1\n"
        f"or on ({NODE})\n"
        f"max by ({NODE}) ({sel(s, 'up')}) * 0"
    )
    return Group("fleetscope-repeat-offenders", (
        Record(NODE_STRAGGLER_FLAGGED, flagged),
        # Each window ends in a 1 -> 0 step of the flag (a reset), or is still open: no offsets, so the
        # count does not depend on how often the group runs.
        Record(NODE_STRAGGLER_WINDOWS, (
            f"resets({NODE_STRAGGLER_FLAGGED}[{window}])\n"
            f"  +\n"
            f"last_over_time({NODE_STRAGGLER_FLAGGED}[{window}])"
        )),
        Record(NODE_STRAGGLER_JOBS, f"count by ({NODE}) (max_over_time({NODE_JOB_STRAGGLERS}[{window}]))"),
        Alert(
            "TrainingNodeRepeatedlySlow",
            f"{NODE_STRAGGLER_JOBS} >= {count}\nor on ({NODE})\n{NODE_STRAGGLER_WINDOWS} >= {count}",
            "warning",
            "A node's ranks keep being flagged as stragglers: take it out of the pool.",
            f"Within the last {window}, ranks on {node} were flagged as stragglers in {jobs} distinct training "
            f"job(s) and {windows} separate window(s) (threshold: {count} of either). A machine that slows job "
            "after job is the machine: drain it and run the node diagnostics.",
        ),
    ), interval=s.repeat_interval)
