"""Progress rules: a hung job and the rank that holds it up, a silent rank, a dead rank.

They read where each rank is (``fleetscope_training_phase``, reported once a
second by fleetscope.client while the process lives) rather than when ranks
last completed a step. In synchronous training every rank finishes the same
last step before a hang: the culprit stalls inside the next step (its loader,
its own code) while the others block in a collective. So the hang alert names
the ranks that are *not* waiting in a collective, or whose reports stopped,
and says so when every rank waits (the network, or a collective some rank
never calls). A rank whose process is gone without saying goodbye is dead:
its own alert, and no hang alert for its job.
"""

from __future__ import annotations

from fleetscope.metrics import training
from fleetscope.record import PHASES, WAITING_PHASE
from fleetscope.rules.model import Alert, Group, Record, num, sel
from fleetscope.rules.settings import Settings
from fleetscope.signals import (
    JOB_HANG_THRESHOLD,
    JOB_HUNG,
    JOB_LAST_PUSH,
    JOB_PROGRESS,
    JOB_STEP,
    RANK_ENDED,
    RANK_GONE,
    RANK_HANG_SUSPECTS,
    RANK_KEY,
    RANK_SILENT,
    indent,
    on_gpu,
)

NOT_WAITING = "|".join(p for p in PHASES if p not in (WAITING_PHASE, "ended"))
SILENT = "silent"  # the phase label of a rank whose reports stopped


def _gone(s: Settings) -> str:
    return f"{sel(s, str(training.PROCESS_UP))} == 0"


def _ended(s: Settings) -> str:
    ended = 'phase="ended"'
    return f"{sel(s, str(training.PHASE), ended)} == 1"


def _silent(s: Settings) -> str:
    """Ranks whose last report is older than ``silent_after_seconds`` (value: that report's time)."""
    return f"{sel(s, str(training.LAST_PUSH_TIMESTAMP_SECONDS))} < time() - {num(s.silent_after_seconds)}"


def _running(expr: str) -> str:
    """``expr`` for ranks that have not said goodbye."""
    return f"{expr}\n  unless on ({RANK_KEY})\n{RANK_ENDED}"


def last_progress(s: Settings) -> str:
    """Per job: when its newest step completed (before any step did: when a rank last changed phase)."""
    last_step = _running(sel(s, str(training.LAST_STEP_TIMESTAMP_SECONDS)))
    phase_start = _running(sel(s, str(training.PHASE_START_TIMESTAMP_SECONDS)))
    return (
        f"max by (training_job) (\n  {indent(last_step)}\n)\n"
        f"  or\n"
        f"max by (training_job) (\n  {indent(phase_start)}\n)"
    )


def hang_threshold(s: Settings) -> str:
    return (
        f"clamp({num(s.hang_step_multiple)} * {JOB_STEP}, {num(s.hang_min_seconds)}, {num(s.hang_max_seconds)})\n"
        f"  or on (training_job)\n"
        f"{JOB_PROGRESS} * 0 + {num(s.hang_max_seconds)}"
    )


def hung(s: Settings) -> str:
    """Jobs past their hang threshold; the value stays their last progress's time."""
    return f"{JOB_PROGRESS}\n  < on (training_job)\ntime() - {JOB_HANG_THRESHOLD}"


def recording_rules(s: Settings) -> Group:
    # The sparse sets first: the rules after them in this group read them at this evaluation.
    return Group("fleetscope-progress.rules", (
        Record(RANK_ENDED, _ended(s)),
        Record(RANK_GONE, _gone(s)),
        Record(RANK_SILENT, _silent(s)),
        Record(JOB_LAST_PUSH, f"max by (training_job) ({sel(s, str(training.LAST_PUSH_TIMESTAMP_SECONDS))})"),
        Record(JOB_PROGRESS, last_progress(s)),
        Record(JOB_HANG_THRESHOLD, hang_threshold(s)),
        Record(JOB_HUNG, hung(s)),
        Record(RANK_HANG_SUSPECTS, suspects(s)),
    ))


def suspects(s: Settings) -> str:
    """Ranks not waiting in a collective (value: when they entered their phase, a label), or gone silent."""
    phase = sel(s, str(training.PHASE), f'phase=~"{NOT_WAITING}"')
    not_waiting = (
        f"{sel(s, str(training.PHASE_START_TIMESTAMP_SECONDS))}\n"
        f"  * on ({RANK_KEY}) group_left (phase)\n"
        f"({phase} == 1)\n"
        f"  unless on ({RANK_KEY})\n"
        f"{RANK_SILENT}"
    )
    went_silent = (
        f'label_replace({RANK_SILENT}, "phase", "{SILENT}", "", "")\n'
        f"  unless on ({RANK_KEY})\n{RANK_ENDED}\n"
        f"  unless on ({RANK_KEY})\n{RANK_GONE}"
    )
    # Only in hung jobs, the one place they are read: at any moment nearly every rank of every job is in its
    # compute phase, and recording them all wrote one series per rank at every evaluation.
    return (
        f"(\n  (\n    {indent(not_waiting, '    ')}\n  )\n  or\n  (\n    {indent(went_silent, '    ')}\n  )\n)\n"
        f"  and on (training_job)\n{JOB_HUNG}"
    )


def _query(s: Settings, metric: str, matchers: str, args: str, then: str, wrap: str = "{}") -> str:
    """A template fragment: run ``metric{matchers}`` (wrapped) for the alert's labels, then ``then``."""
    expr = wrap.format(sel(s, metric, matchers))
    return f"{{{{ with printf `{expr}` {args} | query }}}}{then}{{{{ end }}}}"


def alert_rules(s: Settings) -> Group:
    rank = 'training_job="%s", rank="%s", instance="%s"'
    rank_args = "$labels.training_job $labels.rank $labels.instance"
    job = 'training_job="%s"'
    at_step = _query(s, str(training.CURRENT_STEP), rank, rank_args, " at step {{ . | first | value }}")
    waiting = _query(
        s, str(training.PHASE), f'{job}, phase="{WAITING_PHASE}"', "$labels.training_job",
        "; {{ . | first | value }} of its ranks wait in a collective", "count({} == 1)",
    )
    where = "rank {{ $labels.rank }} on {{ $labels.instance }}{{ with $labels.gpu }} (GPU {{ . }}){{ end }}"
    # The suspects with their GPU, or, where every rank waits in a collective, the job alone; never a job with
    # a dead rank (TrainingRankDead says it).
    hang_expr = (
        f"(\n"
        f"  {indent(on_gpu(f'(time() - {RANK_HANG_SUSPECTS})'))}\n"
        f"  or\n"
        f"  time() - {JOB_HUNG}\n    unless on (training_job)\n  {RANK_HANG_SUSPECTS}\n"
        f")\n"
        f"  unless on (training_job)\n{RANK_GONE}"
    )
    hang_description = (
        "Training job {{ $labels.training_job }} has completed no step for "
        f"{num(s.hang_step_multiple)}x its median step time (clamped to {num(s.hang_min_seconds)}s-"
        f"{num(s.hang_max_seconds)}s). "
        "{{ if $labels.rank }}"
        f"It waits for {where}, which is not waiting in a collective: "
        f'{{{{ if eq $labels.phase "{SILENT}" }}}}its reports stopped {{{{ $value | humanizeDuration }}}} ago '
        "(frozen, stuck in native code holding the GIL, or cut off from the node's daemon)"
        "{{ else }}it has been in its {{ $labels.phase }} phase for {{ $value | humanizeDuration }}{{ end }}"
        f"{at_step}{waiting}."
        "{{ else }}"
        "Every rank that reports waits in a collective: suspect the network, a collective that not every rank "
        "calls, or ranks that report no position (an older client)."
        "{{ end }}"
    )
    dead_phase = _query(
        s, str(training.PHASE), rank, rank_args, " in its {{ (. | first).Labels.phase }} phase", "{} == 1"
    )
    silent_expr = (
        f"(\n"
        f"  time() - {RANK_SILENT}\n"
        f"    unless on ({RANK_KEY})\n  {RANK_ENDED}\n"
        f"    unless on ({RANK_KEY})\n  {RANK_GONE}\n"
        f"    and on (training_job)\n"
        f"  (time() - {JOB_LAST_PUSH} < {num(s.silent_after_seconds)})\n"
        f")"
    )
    alerts = [
        Alert(
            "TrainingJobHang",
            hang_expr,
            "critical",
            "A training job makes no progress; the alert names the rank it waits for.",
            hang_description,
            s.hang_for,
        ),
        Alert(
            "TrainingRankDead",
            on_gpu(RANK_GONE),
            "critical",
            "A training rank's process is gone without saying goodbye.",
            f"The process of {where} of training job {{{{ $labels.training_job }}}} is gone and never said "
            f"goodbye: killed by a signal (the OOM killer, a crash in native code, a node problem){at_step}"
            f"{dead_phase}. Its peers fail, or wait, in their next collective: the job needs a restart.",
            s.dead_for,
        ),
        Alert(
            "TrainingRankSilent",
            on_gpu(silent_expr),
            "warning",
            "A training rank stopped reporting while the other ranks of its job go on.",
            f"{where[0].upper()}{where[1:]} of training job {{{{ $labels.training_job }}}} last reported "
            "{{ $value | humanizeDuration }} ago while other ranks of the job reported recently: its process is "
            "frozen or stuck in native code, cannot reach the node's daemon, or died where the daemon cannot "
            "see it.",
            s.silent_for,
        ),
    ]
    return Group("fleetscope-progress", tuple(alerts))
