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

How long to wait (#26 item 3): a rank outside a collective that most of its
job's ranks wait for in one is *awaited*, and named once its node's last scrape
saw it there for twice the job's median step time (15 s at least), whatever
the job's threshold. A pause is no hang: a rank in a phase of the job's own naming
(``tracker.phase("checkpoint")``), every rank in the same phase of its own
work or between steps (a checkpoint, an evaluation, a recompilation; not every
rank waiting for data: that is a storage outage) or a restarted rank not yet
through a step gives the job the long pause threshold (30 minutes).
Otherwise a job is hung after 10x its median step time without progress,
clamped to 2-30 minutes.

Every timestamp is the node's; each is moved onto Prometheus's clock with its
node's offset before it is compared with ``time()`` (:data:`NODE_CLOCK_OFFSET`),
so a step of a node's wall clock changes no age.
"""

from __future__ import annotations

from fleetscope.metrics import push, training
from fleetscope.promql import (
    JOB_HANG_THRESHOLD,
    JOB_HUNG,
    JOB_LAST_PUSH,
    JOB_PAUSED,
    JOB_PHASE_RANKS,
    JOB_PROGRESS,
    JOB_STEP,
    NODE_CLOCK_OFFSET,
    RANK_AWAITED,
    RANK_ENDED,
    RANK_GONE,
    RANK_HANG_SUSPECTS,
    RANK_KEY,
    RANK_PHASE,
    RANK_SILENT,
    indent,
    on_gpu,
    on_prometheus_clock,
)
from fleetscope.rules.model import Alert, Group, Record, num, sel
from fleetscope.rules.settings import Settings
from fleetscope.wire import PHASES, WAITING_PHASE

NOT_WAITING = "|".join(p for p in PHASES if p not in (WAITING_PHASE, "ended"))
DECLARED = "other"  # the phase of a rank inside a phase of the job's own naming (a declared pause)
AWAITED = "|".join(p for p in PHASES if p not in (WAITING_PHASE, DECLARED, "ended"))
SILENT = "silent"  # the phase label of a rank whose reports stopped
PAUSE_PHASES = "compute|idle|other"  # every rank in one of these at once: a checkpoint, an evaluation


def _gone(s: Settings) -> str:
    return f"{sel(s, str(training.PROCESS_UP))} == 0"


def _ended(s: Settings) -> str:
    return RANK_PHASE + '{phase="ended"}'


def _phase(s: Settings) -> str:
    """Each rank's phase now: its one phase series at 1 (six are exported per rank, one a phase)."""
    return f"{sel(s, str(training.PHASE))} == 1"


def _clock_offset(s: Settings) -> str:
    """Per node: Prometheus's clock minus the node's at the scrape (0 where the daemon does not say)."""
    clock = sel(s, str(push.SCRAPE_TIMESTAMP_SECONDS))
    return (
        f"timestamp({clock}) - {clock}\n"
        f"  or on (instance)\n"
        f"group by (cluster, instance) ({sel(s, str(training.LAST_PUSH_TIMESTAMP_SECONDS))}) * 0"
    )


def _stamp(s: Settings, metric: str) -> str:
    """A node timestamp series on Prometheus's clock."""
    return on_prometheus_clock(sel(s, metric))


def _since(s: Settings) -> str:
    """When each rank entered its phase, on Prometheus's clock, on one line (it opens two suspect sets)."""
    since = sel(s, str(training.PHASE_START_TIMESTAMP_SECONDS))
    return f"({since} + on (instance) group_left () {NODE_CLOCK_OFFSET})"


def _silent(s: Settings) -> str:
    """Ranks whose last report is older than ``silent_after_seconds`` (value: that report's time)."""
    return f"{_stamp(s, str(training.LAST_PUSH_TIMESTAMP_SECONDS))} < time() - {num(s.silent_after_seconds)}"


def _running(expr: str) -> str:
    """``expr`` for ranks that have not said goodbye."""
    return f"{expr}\n  unless on ({RANK_KEY})\n{RANK_ENDED}"


def last_progress(s: Settings) -> str:
    """Per job: when its newest step completed (before any step did: when a rank last changed phase)."""
    last_step = _running(_stamp(s, str(training.LAST_STEP_TIMESTAMP_SECONDS)))
    phase_start = _running(_stamp(s, str(training.PHASE_START_TIMESTAMP_SECONDS)))
    return (
        f"max by (cluster, training_job) (\n  {indent(last_step)}\n)\n"
        f"  or\n"
        f"max by (cluster, training_job) (\n  {indent(phase_start)}\n)"
    )


def _reporting(s: Settings) -> str:
    """Per job: its ranks that report a position and have not said goodbye."""
    return f'sum by (cluster, training_job) ({JOB_PHASE_RANKS}{{phase!="ended"}})'


def paused(s: Settings) -> str:
    """Jobs that pause: a rank in a declared phase, every rank in one phase outside a collective (its own
    work or between steps: every rank waiting for data is a storage outage, not a pause), or a rank restarted
    and not yet through a step (its newest step number goes with its old process)."""
    one_phase = f'{JOB_PHASE_RANKS}{{phase=~"{PAUSE_PHASES}"}}'
    starting = (
        f"{sel(s, str(training.LAST_STEP_TIMESTAMP_SECONDS))}\n"
        f"  unless on ({RANK_KEY})\n{sel(s, str(training.LAST_STEP))}"
    )
    return (
        f"group by (cluster, training_job) (\n"
        f'  {JOB_PHASE_RANKS}{{phase="{DECLARED}"}}\n'
        f"  or\n"
        f"  {one_phase} == on (training_job) group_left () {_reporting(s)}\n"
        f"  or\n"
        f"  count by (cluster, training_job) (\n    {indent(starting, '    ')}\n  )\n"
        f")"
    )


def hang_threshold(s: Settings) -> str:
    return (
        f"clamp({num(s.hang_step_multiple)} * {JOB_STEP}, {num(s.hang_min_seconds)}, {num(s.hang_max_seconds)})\n"
        f"  unless on (training_job)\n{JOB_PAUSED}\n"
        f"  or on (training_job)\n"
        f"{JOB_PROGRESS} * 0 + {num(s.hang_pause_seconds)} and on (training_job) {JOB_PAUSED}\n"
        f"  or on (training_job)\n"
        f"{JOB_PROGRESS} * 0 + {num(s.hang_max_seconds)}"
    )


def awaited(s: Settings) -> str:
    """Ranks outside a collective that most of their job waits for in one, there for long enough (value: when
    they entered their phase, a label); only ranks through a step in their process.

    How long is counted up to the scrape that last saw the rank there, not up to now: a sample is up to a
    scrape interval old when a rule reads it, and a rank seen 9 s into a 10 s step's compute read 21 s at an
    evaluation 12 s later, a false hang of a healthy job. A rank that stays (or whose reports stop) is seen
    there again at every scrape."""
    phase = RANK_PHASE + f'{{phase=~"{AWAITED}"}}'
    long_enough = (
        f"timestamp({sel(s, str(training.PHASE_START_TIMESTAMP_SECONDS))}) - on (training_job) group_left () "
        f"clamp_min({num(s.hang_awaited_step_multiple)} * {JOB_STEP}, {num(s.hang_awaited_min_seconds)})"
    )
    most_wait = (
        f'{JOB_PHASE_RANKS}{{phase="{WAITING_PHASE}"}}\n'
        f"  >= on (training_job)\n{num(s.hang_awaited_share)} * {_reporting(s)}"
    )
    return (
        f"(\n  {_since(s)}\n"
        f"    * on ({RANK_KEY}) group_left (phase)\n  {phase}\n"
        f"    and on ({RANK_KEY})\n  {sel(s, str(training.LAST_STEP))}\n)\n"
        f"  < on ({RANK_KEY}) group_left ()\n{long_enough}\n"
        f"  and on (training_job)\n(\n  {indent(most_wait)}\n)"
    )


def hung(s: Settings) -> str:
    """Jobs past their hang threshold; the value stays their last progress's time."""
    return f"{JOB_PROGRESS}\n  < on (training_job)\ntime() - {JOB_HANG_THRESHOLD}"


def recording_rules(s: Settings) -> Group:
    last_push = str(training.LAST_PUSH_TIMESTAMP_SECONDS)
    # The sparse sets first: the rules after them in this group read them at this evaluation.
    return Group("fleetscope-progress.rules", (
        Record(NODE_CLOCK_OFFSET, _clock_offset(s)),
        # Read once: the job counts, the ended, awaited and suspect ranks all select from it.
        Record(RANK_PHASE, _phase(s)),
        Record(RANK_ENDED, _ended(s)),
        Record(RANK_GONE, _gone(s)),
        Record(RANK_SILENT, _silent(s)),
        Record(JOB_LAST_PUSH, f"max by (cluster, training_job) (\n  {indent(_stamp(s, last_push))}\n)"),
        Record(JOB_PROGRESS, last_progress(s)),
        Record(JOB_PHASE_RANKS, f"count by (cluster, training_job, phase) ({RANK_PHASE})"),
        Record(JOB_PAUSED, paused(s)),
        Record(JOB_HANG_THRESHOLD, hang_threshold(s)),
        Record(JOB_HUNG, hung(s)),
        Record(RANK_AWAITED, awaited(s)),
        Record(RANK_HANG_SUSPECTS, suspects(s)),
        # Last, in the group that records what it reads: it names the rank at the evaluation whose records say
        # so, not an evaluation later (the latency budget, docs/runbooks.md#trainingjobhang).
        hang_alert(s),
    ), interval=s.progress_evaluation_interval)


def suspects(s: Settings) -> str:
    """The awaited ranks; in hung jobs, ranks not waiting in a collective (value: when they entered their phase,
    a label), or gone silent."""
    phase = RANK_PHASE + f'{{phase=~"{NOT_WAITING}"}}'
    not_waiting = (
        f"{_since(s)}\n"
        f"  * on ({RANK_KEY}) group_left (phase)\n"
        f"{phase}\n"
        f"  unless on ({RANK_KEY})\n"
        f"{RANK_SILENT}"
    )
    went_silent = (
        f'label_replace({RANK_SILENT}, "phase", "{SILENT}", "", "")\n'
        f"  unless on ({RANK_KEY})\n({RANK_ENDED} or {RANK_GONE})"
    )
    # Only in hung jobs, the one place they are read: at any moment nearly every rank of every job is in its
    # compute phase, and recording them all wrote one series per rank at every evaluation.
    return (
        f"{RANK_AWAITED}\n  or on ({RANK_KEY})\n"
        f"(\n  {indent(not_waiting)}\n  or\n  {indent(went_silent)}\n)\n"
        f"  and on (training_job)\n{JOB_HUNG}"
    )


def _query(s: Settings, metric: str, matchers: str, args: str, then: str, wrap: str = "{}") -> str:
    """A template fragment: run ``metric{matchers}`` (wrapped) for the alert's labels, then ``then``."""
    expr = wrap.format(sel(s, metric, matchers))
    return f"{{{{ with printf `{expr}` {args} | query }}}}{then}{{{{ end }}}}"


RANK_MATCH = 'training_job="%s", rank="%s", instance="%s"'
RANK_ARGS = "$labels.training_job $labels.rank $labels.instance"
WHERE = "rank {{ $labels.rank }} on {{ $labels.instance }}{{ with $labels.gpu }} (GPU {{ . }}){{ end }}"


def hang_alert(s: Settings) -> Alert:
    rank, rank_args, where = RANK_MATCH, RANK_ARGS, WHERE
    job = 'training_job="%s"'
    at_step = _query(s, str(training.CURRENT_STEP), rank, rank_args, " at step {{ . | first | value }}")
    waiting = _query(
        s, str(training.PHASE), f'{job}, phase="{WAITING_PHASE}"', "$labels.training_job",
        "; {{ . | first | value }} of its ranks wait in a collective", "count({} == 1)",
    )
    # A rank its peers wait for keeps the phase it reported last when its reports stop (one alert, not two).
    stopped = (
        f"{{{{ with printf `time() - {RANK_SILENT}{{{rank}}}` {rank_args} | query }}}}; its reports stopped "
        "{{ . | first | value | humanizeDuration }} ago (frozen, stuck in native code holding the GIL, or cut off "
        "from the node's daemon){{ end }}"
    )
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
        "Training job {{ $labels.training_job }} makes no progress. "
        "{{ if $labels.rank }}"
        f"It waits for {where}, which is not waiting in a collective: "
        f'{{{{ if eq $labels.phase "{SILENT}" }}}}its reports stopped {{{{ $value | humanizeDuration }}}} ago '
        "(frozen, stuck in native code holding the GIL, or cut off from the node's daemon)"
        "{{ else }}it has been in its {{ $labels.phase }} phase for {{ $value | humanizeDuration }}"
        f"{stopped}{{{{ end }}}}{at_step}{waiting}."
        "{{ else }}"
        "It has completed no step for {{ $value | humanizeDuration }}, and every rank that reports waits in a "
        "collective: suspect the network, a collective that not every rank calls, or ranks that report no "
        "position (an older client)."
        "{{ end }}"
    )
    return Alert(
        "TrainingJobHang",
        hang_expr,
        "critical",
        "A training job makes no progress; the alert names the rank it waits for.",
        hang_description,
        s.hang_for,
    )


def alert_rules(s: Settings) -> Group:
    rank, rank_args, where = RANK_MATCH, RANK_ARGS, WHERE
    at_step = _query(s, str(training.CURRENT_STEP), rank, rank_args, " at step {{ . | first | value }}")
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
    return Group("fleetscope-progress", tuple(alerts), interval=s.progress_evaluation_interval)
