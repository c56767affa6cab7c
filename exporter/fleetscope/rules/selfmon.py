"""Rules about fleetscope itself: the daemon, its collectors, its push receiver."""

from __future__ import annotations

from fleetscope.check.verdicts import FINDINGS, nodes_carrying, nodes_scraped
from fleetscope.metrics import engine, push
from fleetscope.promql import CLUSTER_BREAKER_ALLOWED, CLUSTER_BREAKER_CARRYING, indent
from fleetscope.rules.model import Alert, Group, Record, Rule, held, num, sel
from fleetscope.rules.settings import Settings, seconds

NOT_DUPLICATE = 'reason!="duplicate"'  # the matcher for every refusal but an acknowledged re-send


def alert_rules(s: Settings) -> Group:
    # Every alert waits 5m or more, or (the breaker) counts over a 10m window.
    return Group("fleetscope", (
        *breaker_records(s),
        Alert(
            "FleetscopeDown", f"{sel(s, 'up')} == 0", "warning",
            "A fleetscope daemon cannot be scraped.",
            "Prometheus cannot scrape fleetscope on {{ $labels.instance }}: GPU, EFA and training metrics "
            "of this node are missing.",
            s.down_for,
        ),
        Alert(
            "FleetscopeCollectorFailing",
            (
                f"{held(s, engine.COLLECTOR_SUCCESS)} == 0\n"
                f"and on (instance, job, collector)\n"
                f"{held(s, engine.COLLECTOR_HARDWARE_PRESENT)} == 1"
            ),
            "warning",
            "A fleetscope collector fails although its hardware is present.",
            "Collector {{ $labels.collector }} on {{ $labels.instance }} fails or times out; its metrics are "
            "stale or missing.",
            s.collector_failing_for,
        ),
        Alert(
            "FleetscopePushRejected",
            # A re-send after a timeout is the client's normal recovery, acknowledged without counting.
            f"rate({sel(s, push.REJECTED_TOTAL, NOT_DUPLICATE)}[{s.rate_window}]) "
            f"> {num(s.push_rejected_per_second)}",
            "warning",
            "fleetscope rejects step records pushed by training jobs.",
            "fleetscope on {{ $labels.instance }} rejects {{ printf \"%.2f\" $value }} pushed records per second "
            "(reason {{ $labels.reason }}).",
            s.push_rejected_for,
        ),
        breaker_alert(s),
    ), interval=s.slow_evaluation_interval)


def breaker_records(s: Settings) -> tuple[Rule, ...]:
    """Per cluster: how many nodes may carry one finding, and per finding how many did within the window (the
    count `check` makes, from fleetscope.check.verdicts): one short rule each, before the alert reading them."""
    window = seconds(s.breaker_window)
    scraped = indent(nodes_scraped(s.selector, window, by="cluster"))
    allowed = f"clamp_min(ceil(\n  {scraped}\n  * {num(s.breaker_percent)} / 100\n), 1)"
    return (
        Record(CLUSTER_BREAKER_ALLOWED, allowed),
        *(Record(CLUSTER_BREAKER_CARRYING, nodes_carrying(finding, window, by="cluster"), {"finding": finding.alert})
          for finding in FINDINGS),
    )


def breaker_alert(s: Settings) -> Alert:
    """The circuit breaker of `fleetscope check` tripped for a cross-node finding (fleetscope.check.verdicts)."""
    return Alert(
        "FleetscopeBreakerTripped",
        f"{CLUSTER_BREAKER_CARRYING}\n  > on (cluster) group_left ()\n{CLUSTER_BREAKER_ALLOWED}",
        "warning",
        "Too many nodes carry one cross-node finding: fleetscope check holds it back instead of marking them.",
        "{{ $value }} nodes{{ with $labels.cluster }} of cluster {{ . }}{{ end }} carried {{ $labels.finding }} "
        f"within the last {s.breaker_window}, more than {num(s.breaker_percent)}% of the nodes fleetscope scrapes "
        "there. `fleetscope check` reports it as could-not-tell (node condition Unknown, no Slurm drain) on "
        "every one of them: a fleet-wide cause (a network event, a driver rollout, Prometheus itself) is likelier "
        "than that many bad nodes. Find what they share; nodes are marked again once fewer carry it.",
    )
