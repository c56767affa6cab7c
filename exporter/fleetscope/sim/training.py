"""Synthetic training jobs: synchronous data-parallel ranks that produce step records.

Every rank does its own data wait and compute, then all ranks meet in a
collective: the step ends for everyone when the slowest rank arrives, so a
slow rank shows up as longer *compute* on itself and longer *comm* (waiting)
on all the others, which is what the straggler rules compare. A slower GPU
(throttled, or a rank_slow fault) stretches only the accelerator share of the
compute: host work (Python, kernel launches) keeps the CPU's pace. Ranks leave
a collective a few milliseconds apart (a real 8-rank job's last-step times
spread over 6-9 ms). Step times carry a few percent of jitter and a slow drift.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleetscope.sim.faults import Fault


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
    steps: int = 0
    last_step_time: float = 0.0
    alive: bool = True
    stalled: bool = False  # no progress (a hang, or blocked on a dead peer)
    phase: str = "compute"  # where the rank is, as its client reports it: a stalled rank's tells the hang apart


@dataclass
class JobModel:
    """One job's ranks and the clock of its next step."""

    spec: JobSpec
    seed: int
    start: float = 0.0  # simulation time the job starts
    ranks: list[RankState] = field(default_factory=list)
    next_step_end: float = 0.0
    _rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.ranks = [
            RankState(rank=n * self.spec.ranks_per_node + lr, local_rank=lr, node=node)
            for n, node in enumerate(self.spec.nodes)
            for lr in range(self.spec.ranks_per_node)
        ]
        self.next_step_end = self.start + self.spec.step_seconds

    def rank_on(self, node: str, gpu: int) -> RankState | None:
        rank = self.spec.rank_at(node, gpu)
        return None if rank is None else self.ranks[rank]

    # -- fault effects ------------------------------------------------------------------------

    def _accelerator_factor(self, state: RankState, faults: list[Fault]) -> float:
        """How much longer this rank's GPU takes for its kernels (a slowdown fault's ``slowdown``)."""
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

    def _apply_liveness(self, faults: Iterable[Fault], now: float) -> None:
        for fault in faults:
            if fault.job != self.spec.name or now < fault.at:
                continue
            if fault.kind == "rank_dies":
                for state in self.ranks:
                    if state.rank == fault.rank:
                        state.alive = False
                        state.stalled = True
                    elif now >= fault.at + fault.param("block_after"):
                        # Sooner or later the survivors need the dead rank in a collective and block.
                        state.stalled, state.phase = True, "comm"
            elif fault.kind == "job_hang":
                first = int(fault.param("first_rank"))
                for state in self.ranks:
                    if state.rank == first:
                        state.stalled, state.phase = True, "data"  # its loader stopped answering
                    elif now >= fault.at + fault.param("lag"):
                        state.stalled, state.phase = True, "comm"  # waiting for it in the collective

    def busy(self) -> float:
        """How busy this job keeps its GPUs and network (0 when it makes no progress)."""
        return 0.0 if all(s.stalled for s in self.ranks) else 0.95

    # -- steps ---------------------------------------------------------------------------------

    def advance(self, now: float, wall_offset: float, faults: list[Fault]) -> list[tuple[RankState, dict[str, Any]]]:
        """Complete every step that ends by simulation time ``now``; returns (rank, record) pairs.

        ``wall_offset`` turns simulation time into Unix time for the records' timestamps.
        """
        records: list[tuple[RankState, dict[str, Any]]] = []
        spec = self.spec
        while self.next_step_end <= now:
            step_end = self.next_step_end
            active = [f for f in faults if f.active(step_end)]
            self._apply_liveness(faults, step_end)
            working = [s for s in self.ranks if s.alive and not s.stalled]
            if not working:
                self.next_step_end = now + spec.step_seconds
                break
            drift = 1.0 + spec.drift_amplitude * math.sin(2 * math.pi * (step_end - self.start) / spec.drift_period)
            base_compute = spec.step_seconds * spec.compute_share * drift
            base_data = spec.step_seconds * spec.data_share
            own: dict[int, tuple[float, float]] = {}
            for state in self.ranks:
                data = base_data * (1 + self._rng.uniform(-0.2, 0.2)) + self._extra_data(state, active)
                work = base_compute * (1 + self._rng.gauss(0, spec.jitter))
                accelerator = work * spec.accelerator_share * self._accelerator_factor(state, active)
                own[state.rank] = (data, max(work * (1 - spec.accelerator_share) + accelerator, 1e-3))
            # The collective itself (the part no rank can hide), then everyone leaves together.
            collective = spec.step_seconds * spec.comm_share * drift \
                * (1 + abs(self._rng.gauss(0, spec.jitter)))
            slowest = max(d + c for d, c in own.values())
            step_seconds = slowest + collective
            for state in working:
                data, compute = own[state.rank]
                state.steps += 1
                state.last_step_time = step_end
                loss = 2.1 + 7.5 / (1 + state.steps / 150) + self._rng.gauss(0, 0.03)
                records.append((state, {
                    "job": spec.name, "rank": state.rank, "local_rank": state.local_rank, "step": state.steps,
                    "step_seconds": round(step_seconds, 6), "data_seconds": round(data, 6),
                    "compute_seconds": round(compute, 6),
                    "comm_seconds": round(max(0.0, step_seconds - data - compute), 6),
                    "tokens": spec.tokens_per_rank_step, "samples": spec.samples_per_rank_step,
                    "loss": round(loss, 5), "world_size": spec.world_size, "pp_stage": 0,
                    "dp_rank": state.rank, "gpu": state.local_rank,
                    "timestamp": wall_offset + step_end + self._rng.uniform(0.0, spec.exit_skew),
                }))
            self.next_step_end = step_end + step_seconds
        return records
