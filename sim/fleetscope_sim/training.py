"""Synthetic training jobs: synchronous data-parallel ranks shaped like real ones.

A step, for every rank: its own data wait, then its compute (host work plus accelerator time),
then the collective, which ends for everyone once the slowest rank has arrived and the
transfer itself is done. So:

* a slow rank shows up as longer *compute* (or *data*) on itself and longer *comm* (waiting in
  the collective) on every other rank, which is what the straggler rules compare;
* a throttled GPU stretches only the accelerator share of the compute; host work (Python,
  kernel launches, the optimizer's bookkeeping) runs at the CPU's pace;
* every rank completes the same steps: nobody finishes step k+1 before all have finished k;
* a rank that stalls (a hung data loader, a stuck kernel) stalls *inside* a step: its peers do
  their own part of that step and then wait in the collective, so no rank ever completes it, and
  every rank's last completed step is the same one. Only where the ranks are inside the open
  step tells the culprit from its peers: it sits in data or compute, they sit in comm;
* a rank whose process dies leaves its peers waiting in the collective of the step it died in.

Ranks leave a collective a few milliseconds apart (the last step's timestamps of a real 8-rank
job spread over 6-9 ms), and step times carry a few percent of jitter and a slow drift.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetscope_sim.faults import Fault

Phase = Literal["data", "compute", "comm"]


@dataclass(frozen=True)
class JobSpec:
    name: str
    nodes: tuple[str, ...]
    ranks_per_node: int = 8
    step_seconds: float = 2.0  # typical step at the start
    data_share: float = 0.02
    compute_share: float = 0.82
    accelerator_share: float = 0.85  # of compute: kernel time on the GPU; the rest is host work
    tokens_per_rank_step: int = 8 * 4096
    samples_per_rank_step: int = 8
    drift_amplitude: float = 0.03  # slow drift of the whole job's speed
    drift_period: float = 900.0
    jitter: float = 0.025
    exit_skew: float = 0.008  # ranks leave a collective up to this many seconds apart

    @property
    def comm_share(self) -> float:
        """Share of a typical step in the collectives themselves (what no rank can hide)."""
        return 1 - self.compute_share - self.data_share

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.ranks_per_node

    def rank_at(self, node: str, gpu: int) -> int | None:
        """The rank on ``node``'s GPU ``gpu`` (ranks fill the job's nodes in order, one per GPU)."""
        if node not in self.nodes or not 0 <= gpu < self.ranks_per_node:
            return None
        return self.nodes.index(node) * self.ranks_per_node + gpu

    def placement(self, rank: int) -> tuple[str, int]:
        """(node, GPU) of ``rank``."""
        return self.nodes[rank // self.ranks_per_node], rank % self.ranks_per_node


@dataclass
class RankState:
    rank: int
    local_rank: int
    node: str
    steps: int = 0  # completed steps
    last_step_time: float = 0.0
    alive: bool = True


@dataclass(frozen=True)
class Position:
    """Where a live rank is inside its open step (what a rank reports while a step is open)."""

    step: int  # the open step's number
    phase: Phase
    since: float  # simulation time the phase began


@dataclass
class OpenStep:
    """The step every rank is in: when each rank ends its data wait and reaches the collective, and
    when (if ever) the collective completes."""

    number: int
    start: float
    data_end: dict[int, float]  # rank -> simulation time its data wait ends (inf: never)
    arrive: dict[int, float]  # rank -> simulation time it reaches the collective (inf: never)
    collective: float  # the transfer itself, once everyone is there
    dead: dict[int, float] = field(default_factory=dict)  # rank -> time its process died in this step
    stalled_at: float = math.inf  # when a rank stalled for good or died: the step can no longer complete

    @property
    def end(self) -> float:
        """When the collective completes for everyone: never if a rank never arrives or died."""
        if self.dead:
            return math.inf
        return max(self.arrive.values()) + self.collective


@dataclass
class JobModel:
    """One job's ranks and its open step."""

    spec: JobSpec
    seed: int
    start: float = 0.0  # simulation time the job starts
    ranks: list[RankState] = field(default_factory=list)
    current: OpenStep | None = None
    _rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.ranks = [
            RankState(rank=n * self.spec.ranks_per_node + lr, local_rank=lr, node=node)
            for n, node in enumerate(self.spec.nodes)
            for lr in range(self.spec.ranks_per_node)
        ]

    def rank_on(self, node: str, gpu: int) -> RankState | None:
        rank = self.spec.rank_at(node, gpu)
        return None if rank is None else self.ranks[rank]

    # -- fault effects ------------------------------------------------------------------------

    def _accelerator_factor(self, state: RankState, faults: list[Fault]) -> float:
        factor = 1.0
        for fault in faults:
            on_gpu = fault.kind in ("thermal_throttle", "hw_slowdown") and fault.node == state.node \
                and fault.gpu == state.local_rank
            on_rank = fault.kind == "rank_slow" and fault.job == self.spec.name and fault.rank == state.rank
            if on_gpu or on_rank:
                factor *= fault.param("slowdown")
        return factor

    def _extra_data(self, state: RankState, faults: list[Fault]) -> float:
        extra = 0.0
        for fault in faults:
            if fault.kind == "slow_dataloader" and fault.job == self.spec.name and fault.rank == state.rank:
                extra += fault.param("data_share") * self.spec.step_seconds
        return extra

    def _mine(self, faults: list[Fault], kind: str) -> list[Fault]:
        return [f for f in faults if f.kind == kind and f.job == self.spec.name and f.rank is not None]

    def _stall(self, step: OpenStep, faults: list[Fault]) -> None:
        """A hung rank stops inside the phase the fault names, from the fault's start to its end (forever,
        for a fault without one): that phase, and so its arrival at the collective, lasts that much longer."""
        for fault in self._mine(faults, "job_hang"):
            rank = int(fault.rank or 0)
            in_data = fault.choice("phase") == "data"
            begin = step.start if in_data else step.data_end[rank]
            end = step.data_end[rank] if in_data else step.arrive[rank]
            stalled_from = max(begin, fault.at)
            if fault.at >= end or stalled_from >= fault.at + fault.duration:
                continue  # the phase was over before the stall, or the stall is over before the phase
            extra = fault.at + fault.duration - stalled_from
            if math.isinf(extra):
                step.stalled_at = min(step.stalled_at, stalled_from)
            if in_data:
                step.data_end[rank] += extra
            step.arrive[rank] += extra

    def _deaths(self, step: OpenStep, faults: list[Fault]) -> None:
        """A rank that dies before the collective completes takes the step with it: its peers wait there."""
        for fault in self._mine(faults, "rank_dies"):
            rank = int(fault.rank or 0)
            if fault.at < step.end:
                step.dead[rank] = max(fault.at, step.start)
                step.stalled_at = min(step.stalled_at, step.dead[rank])

    # -- steps ---------------------------------------------------------------------------------

    def _open(self, number: int, start: float, faults: list[Fault]) -> OpenStep:
        spec = self.spec
        active = [f for f in faults if f.active(start)]
        drift = 1.0 + spec.drift_amplitude * math.sin(2 * math.pi * (start - self.start) / spec.drift_period)
        base_compute = spec.step_seconds * spec.compute_share * drift
        data_end: dict[int, float] = {}
        arrive: dict[int, float] = {}
        for state in self.ranks:
            data = spec.step_seconds * spec.data_share * (1 + self._rng.uniform(-0.2, 0.2)) \
                + self._extra_data(state, active)
            own = base_compute * (1 + self._rng.gauss(0, spec.jitter))
            accelerator = own * spec.accelerator_share * self._accelerator_factor(state, active)
            compute = max(own * (1 - spec.accelerator_share) + accelerator, 1e-3)
            data_end[state.rank] = start + data
            arrive[state.rank] = start + data + compute
        # The collective itself: the part no rank can hide, once all are there.
        collective = spec.step_seconds * spec.comm_share * drift \
            * (1 + abs(self._rng.gauss(0, spec.jitter)))
        step = OpenStep(number, start, data_end, arrive, collective)
        self._stall(step, faults)
        self._deaths(step, faults)
        return step

    def advance(self, now: float, wall_offset: float, faults: list[Fault]) -> list[tuple[RankState, dict[str, Any]]]:
        """Complete every step that ends by simulation time ``now``; returns (rank, record) pairs.

        ``wall_offset`` turns simulation time into Unix time for the records' timestamps.
        """
        records: list[tuple[RankState, dict[str, Any]]] = []
        if self.current is None:
            self.current = self._open(1, self.start, faults)
        while self.current.end <= now:
            step = self.current
            end = step.end
            for state in self.ranks:
                # Each rank leaves the collective a little apart; its step runs from its previous exit.
                exit_at = end + self._rng.uniform(0.0, self.spec.exit_skew)
                began = state.last_step_time if state.steps else step.start
                step_seconds = exit_at - began
                data = step.data_end[state.rank] - step.start
                compute = step.arrive[state.rank] - step.data_end[state.rank]
                state.steps = step.number
                state.last_step_time = exit_at
                loss = 2.1 + 7.5 / (1 + state.steps / 150) + self._rng.gauss(0, 0.03)
                records.append((state, {
                    "job": self.spec.name, "rank": state.rank, "local_rank": state.local_rank, "step": state.steps,
                    "step_seconds": round(step_seconds, 6), "data_seconds": round(data, 6),
                    "compute_seconds": round(compute, 6),
                    "comm_seconds": round(max(0.0, step_seconds - data - compute), 6),
                    "tokens": self.spec.tokens_per_rank_step, "samples": self.spec.samples_per_rank_step,
                    "loss": round(loss, 5), "world_size": self.spec.world_size, "pp_stage": 0,
                    "dp_rank": state.rank, "gpu": state.local_rank, "timestamp": wall_offset + exit_at,
                }))
            self.current = self._open(step.number + 1, end, faults)
        for rank, died in self.current.dead.items():
            if died <= now:
                self.ranks[rank].alive = False
        return records

    def position(self, rank: int, now: float) -> Position | None:
        """Where ``rank`` is inside the open step at simulation time ``now`` (None: its process is gone)."""
        step = self.current
        if step is None or not self.ranks[rank].alive:
            return None
        if now < step.data_end[rank]:
            return Position(step.number, "data", step.start)
        if now < step.arrive[rank]:
            return Position(step.number, "compute", step.data_end[rank])
        return Position(step.number, "comm", step.arrive[rank])

    def stuck(self, now: float = math.inf) -> bool:
        """By simulation time ``now`` a rank has stalled for good or died: no step completes any more."""
        return self.current is not None and not math.isinf(self.current.stalled_at) \
            and self.current.stalled_at <= now

    def busy(self, now: float) -> float:
        """How busy this job keeps its network (0 once it is stuck: nothing moves)."""
        return 0.0 if self.stuck(now) else 0.95

    def gpu_busy(self, rank: int, now: float) -> float:
        """How busy ``rank`` keeps its GPU. In a stuck job the peers' NCCL kernels spin in the collective
        and a kernel that never finishes keeps its GPU busy too, as NVML reports them; only a rank stalled
        waiting for its input, or whose process died, leaves its GPU idle."""
        where = self.position(rank, now)
        if where is None:
            return 0.0
        if self.stuck(now) and where.phase == "data":
            return 0.0
        return 0.95
