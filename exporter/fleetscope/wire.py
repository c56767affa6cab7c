"""The step record: what a training rank reports, with every field written once.

A rank reports who it is (``job``, ``rank``), where it runs (placement), which
process it is, the steps it completed since its last report, and where it is
now (its *position*: the open step and the phase it is in). Everything else is
derived from the tables here:

* the daemon's wire models (:mod:`fleetscope.push.models`, pydantic) take each
  field's type, bounds and description;
* the store (:mod:`fleetscope.push.store`) keeps each field as its :class:`Role`
  says (summed, summed with a rolling median, newest value, label);
* the exposition (:mod:`fleetscope.collectors.steps`) reads the store's values
  by the keys :func:`value_keys` derives, which are the keys of the per-rank
  metric table;
* the client (:mod:`fleetscope.client`) builds records and reports from the
  same names.

Standard library only: the training-side client imports it.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

MAX_ID_LENGTH = 128
MAX_RANK = 1 << 24
# Bounds that keep sums finite and exact (#18 item 12): a step longer than this is garbage, and integers
# stay below 2**53, where a float (every total is one) still holds them exactly.
MAX_STEP_SECONDS = 1e6  # about 11.6 days
MAX_COUNT = 1 << 53


class Role(enum.Enum):
    """How the daemon keeps a field."""

    KEY = "key"  # identifies the rank: (job, rank)
    LABEL = "label"  # placement exposed as a label of every per-rank series
    INFO = "info"  # placement exposed on the rank's _info series
    PROCESS = "process"  # identifies the pushing process, for the daemon to watch
    SESSION = "session"  # with the process, identifies one run of the rank's reporting (a restart is a new one)
    LEASE = "lease"  # the secret that makes a live rank's reports its own process's: checked, never kept as a fact
    NUMBER = "number"  # the step number: the newest is kept
    TIME = "time"  # when the step completed: the newest is kept
    DURATION = "duration"  # seconds: summed, and a rolling median over the last steps
    COUNT = "count"  # summed
    LATEST = "latest"  # the newest value reported (a step without one keeps the previous)


@dataclass(frozen=True)
class Field:
    """One field of the wire format. Bounds are inclusive unless named ``below``."""

    name: str
    role: Role
    type: str  # "int", "float", "str" or "int|str"
    help: str
    required: bool = False
    minimum: float | None = None
    above: float | None = None  # exclusive lower bound
    maximum: float | None = None
    below: float | None = None  # exclusive upper bound
    min_length: int | None = None
    max_length: int | None = None
    finite: bool = True  # NaN and infinities refused


# Who the rank is and where it runs: the same in every step of a process.
RANK_FIELDS: tuple[Field, ...] = (
    Field("job", Role.KEY, "str", "Training job id.", required=True, min_length=1, max_length=MAX_ID_LENGTH),
    Field("rank", Role.KEY, "int", "Global rank of the pushing process.", required=True, minimum=0,
          below=MAX_RANK),
    Field("local_rank", Role.LABEL, "int", "Rank within the node.", minimum=0, below=MAX_RANK),
    Field("pp_stage", Role.LABEL, "int", "Pipeline-parallel stage.", minimum=0, below=MAX_RANK),
    Field("world_size", Role.INFO, "int", "Number of ranks in the job.", minimum=1, maximum=MAX_RANK),
    Field("dp_rank", Role.INFO, "int", "Data-parallel rank.", minimum=0, below=MAX_RANK),
    Field("gpu", Role.INFO, "int|str", "GPU index or UUID (MIG: GPU index:instance) the rank runs on.",
          minimum=0, below=MAX_RANK, max_length=MAX_ID_LENGTH),
    Field("pid", Role.PROCESS, "int", "Process id of the rank, as the rank sees it.", minimum=1,
          below=1 << 31),
    Field("start_time", Role.PROCESS, "int",
          "Start time of the process in clock ticks after boot (/proc/self/stat field 22): with pid, tells a "
          "restarted rank from the old one, and lets the daemon find the process from another PID namespace.",
          minimum=0, below=MAX_COUNT),
    Field("session", Role.SESSION, "int",
          "Random id of the reporting tracker: with pid and start_time, tells a restarted rank from the old one "
          "(also when one process hosts several, as a simulator does).", minimum=0, below=1 << 63),
    Field("lease", Role.LEASE, "str",
          "Random secret of the rank's reporting process (the client makes one per process, job and rank): while "
          "that process lives, the daemon refuses (409) steps, phases and job ends for the rank without it.",
          min_length=16, max_length=MAX_ID_LENGTH),
)

# One completed step.
STEP_FIELDS: tuple[Field, ...] = (
    Field("step", Role.NUMBER, "int", "Step number (optimizer updates so far).", required=True, minimum=0,
          below=MAX_COUNT),
    Field("step_seconds", Role.DURATION, "float",
          "Wall time of the step (on a GPU the device's: from the end of the previous step's work to the end "
          "of this one's).", required=True, minimum=0, maximum=MAX_STEP_SECONDS),
    Field("data_seconds", Role.DURATION, "float",
          "Time the rank waited for input: on a GPU the device's idle time while the host fetched (CUDA events "
          "at the step's edges), elsewhere the host's fetch time.", minimum=0, maximum=MAX_STEP_SECONDS),
    Field("fetch_seconds", Role.DURATION, "float",
          "Host time the training loop spent fetching the step's input (the loader's latency), whatever the "
          "device did meanwhile.", minimum=0, maximum=MAX_STEP_SECONDS),
    Field("compute_seconds", Role.DURATION, "float",
          "The rank's own work (forward, backward, optimizer), excluding collective waits.", minimum=0,
          maximum=MAX_STEP_SECONDS),
    Field("comm_seconds", Role.DURATION, "float", "Exposed wait in collective communication.", minimum=0,
          maximum=MAX_STEP_SECONDS),
    Field("tokens", Role.COUNT, "int", "Tokens processed by this rank in the step.", minimum=0, below=MAX_COUNT),
    Field("samples", Role.COUNT, "int", "Samples processed by this rank in the step.", minimum=0, below=MAX_COUNT),
    Field("loss", Role.LATEST, "float", "Loss of the step (NaN and infinities allowed: they are news).",
          finite=False),
    Field("timestamp", Role.TIME, "float",
          "Unix time the step completed (default: when the daemon received it).", above=0),
)

# Version 1 of the wire format: one flat record per step, rank fields repeated in each.
RECORD_FIELDS: tuple[Field, ...] = RANK_FIELDS + STEP_FIELDS

# Where a rank is: the phase it is in now. ``compute`` is any time inside a step outside the data and
# comm phases (the rank's own work); ``other`` a phase of the user's own naming; ``idle`` between steps;
# ``ended`` after the process said goodbye (the tracker was closed, or the interpreter exited).
PHASES: tuple[str, ...] = ("data", "compute", "comm", "other", "idle", "ended")
WAITING_PHASE = "comm"  # a rank here waits for its peers in a collective

# The open step and the phase the rank is in: sent with every report, at least once a second.
POSITION_FIELDS: tuple[Field, ...] = (
    Field("step", Role.NUMBER, "int", "The step the rank is in (the next one when between steps).",
          required=True, minimum=0, below=MAX_COUNT),
    Field("phase", Role.LATEST, "str", f"The phase the rank is in: {', '.join(PHASES)}.", required=True),
    Field("since", Role.TIME, "float", "Unix time the rank entered the phase.", required=True, above=0),
)


def fields(role: Role, among: tuple[Field, ...] = RECORD_FIELDS) -> tuple[Field, ...]:
    return tuple(f for f in among if f.role is role)


def names(role: Role, among: tuple[Field, ...] = RECORD_FIELDS) -> tuple[str, ...]:
    return tuple(f.name for f in among if f.role is role)


def median_key(name: str) -> str:
    """The store's key for the rolling median of a duration field."""
    return f"{name}_median"


STEPS_KEY = "steps"  # steps stored for the rank (records, not a field)
LAST_PUSH_KEY = "last_push"  # when the daemon last heard from the rank


def value_keys() -> tuple[str, ...]:
    """Every per-rank value the store derives from a rank's steps, by the key the metric table uses."""
    keys: list[str] = [STEPS_KEY]
    for f in STEP_FIELDS:
        keys.append(f.name)
        if f.role is Role.DURATION:
            keys.append(median_key(f.name))
    keys.append(LAST_PUSH_KEY)
    return tuple(keys)


def process_state(pid: int | str = "self", procfs: str = "/proc") -> tuple[str, int] | None:
    """(state, start time) of a process from ``<procfs>/<pid>/stat``; None when there is no such process.

    The state is field 3 (``R``, ``S``, ``D``, ``T``, ``Z`` for a zombie...). The start time, field 22, is
    the ``start_time`` field: clock ticks after boot, the same in every PID namespace, so with the pid it
    names one process, tells a restart from the old one, and lets the node's daemon find it from outside
    a container.
    """
    try:
        with open(os.path.join(procfs, str(pid), "stat"), "rb") as stat:
            text = stat.read().decode("ascii", "replace")
        # The command name (field 2) is in parentheses and may contain anything, spaces included.
        fields = text[text.rindex(")") + 2:].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def process_start_time(pid: int | str = "self", procfs: str = "/proc") -> int | None:
    """The ``start_time`` field of a process (see :func:`process_state`)."""
    state = process_state(pid, procfs)
    return state[1] if state is not None else None
