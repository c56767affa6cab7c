"""Synthetic synchronous training as the daemon exports it, written as promtool input series.

Long noisy runs are too long to write by hand, so the straggler-sensitivity
tests describe a job here (ranks, noise, the fault) and generate the series a
fleetscope daemon would expose, scrape by scrape:

* every step, each rank waits for data and computes; its compute is host work
  plus accelerator work, and a slower accelerator stretches only the latter
  (a rank 10% slower in its accelerator share measures about 9.6% slower);
* all ranks then meet in a collective: the step ends for everyone when the
  slowest arrives, so the others' extra time lands in ``comm``;
* the daemon keeps counters and rolling medians over each rank's last
  ``median_window`` steps, and the rank pushes every second.

:func:`main` runs the scenarios of ``test_sensitivity.py`` through promtool
and prints each one's time to detect (``python3 -m tests.alerts.sensitivity``).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetscope_sim.virtual import promtool_test_rules


@dataclass(frozen=True)
class Rank:
    rank: int
    instance: str
    gpu: int
    pp_stage: int = 0


def ranks_on(nodes: int, per_node: int, stages: int = 1) -> tuple[Rank, ...]:
    """``nodes`` x ``per_node`` ranks, rank r on node r // per_node, GPU = local rank; stages split evenly."""
    total = nodes * per_node
    return tuple(
        Rank(r, f"node-{r // per_node}:9402", r % per_node, r * stages // total) for r in range(total)
    )


@dataclass(frozen=True)
class Job:
    name: str
    ranks: tuple[Rank, ...]
    step_seconds: float = 2.0  # a healthy step of stage 0
    stage_cost: tuple[float, ...] = (1.0,)  # compute of each pipeline stage, relative to stage 0
    compute_share: float = 0.80
    data_share: float = 0.02
    host_share: float = 0.04  # of compute: host work a slower accelerator does not stretch
    noise: float = 0.03  # SD of each rank's compute per step (Gaussian)
    slow_rank: int | None = None
    slowdown: float = 0.0  # extra accelerator time of the slow rank (0.1 = 10% slower accelerator)
    onset: float = 0.0  # seconds after the start the slow rank turns slow
    checkpoint_every: int = 0  # rank 0 writes a checkpoint inside its step every N steps...
    checkpoint_seconds: float = 0.0  # ...taking this long, booked as its compute (the worst place for it)
    drift: float = 0.0  # every rank this much slower at the end of the run than at its start (linear)
    seed: int = 1

    @property
    def collective_share(self) -> float:
        return 1 - self.compute_share - self.data_share


@dataclass
class _RankState:
    steps: int = 0
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("step", "data", "compute", "comm"), 0.0))
    recent: dict[str, deque[float]] = field(default_factory=dict)
    last_step_time: float = 0.0


PHASES = ("step", "data", "compute", "comm")


def steps(job: Job, start: float, end: float) -> Iterator[tuple[float, list[dict[str, float]]]]:
    """(end time, one record per rank) for every step of the run, in order."""
    rng = random.Random(job.seed)
    stage_compute = [job.step_seconds * job.compute_share * c for c in job.stage_cost]
    step_count = 0
    now = start
    duration = end - start
    while now < end:
        drift = 1 + job.drift * max(0.0, now) / duration
        own = []
        for rank in job.ranks:
            compute = stage_compute[rank.pp_stage] * drift
            accelerator = compute * (1 - job.host_share)
            if rank.rank == job.slow_rank and now >= job.onset:
                accelerator *= 1 + job.slowdown
            compute = (compute * job.host_share + accelerator) * (1 + rng.gauss(0, job.noise))
            every = job.checkpoint_every
            if every and rank.rank == 0 and step_count % every == every - 1:
                compute += job.checkpoint_seconds
            data = job.step_seconds * job.data_share * (1 + rng.uniform(-0.2, 0.2))
            own.append((data, max(compute, 1e-3)))
        collective = job.step_seconds * job.collective_share * drift * (1 + abs(rng.gauss(0, job.noise)))
        step = max(d + c for d, c in own) + collective
        now += step
        step_count += 1
        yield now, [{"step": step, "data": d, "compute": c, "comm": step - d - c} for d, c in own]


def series(job: Job, duration: float, scrape: float = 30.0, median_window: int = 32,
           job_label: str = "fleetscope") -> list[dict[str, str]]:
    """promtool ``input_series`` for ``job``: what a scrape every ``scrape`` seconds sees for ``duration``."""
    warmup = median_window * job.step_seconds * max(job.stage_cost) * 2
    states = {r.rank: _RankState(recent={p: deque(maxlen=median_window) for p in PHASES}) for r in job.ranks}
    samples: dict[str, list[float | None]] = {}
    scrape_times = [i * scrape for i in range(int(duration // scrape) + 1)]
    records = steps(job, -warmup, duration)
    pending = next(records, None)

    def record(key: str, value: float | None) -> None:
        samples.setdefault(key, []).append(value)

    for t in scrape_times:
        while pending is not None and pending[0] <= t:
            end, per_rank = pending
            for rank, values in zip(job.ranks, per_rank, strict=True):
                state = states[rank.rank]
                state.steps += 1
                state.last_step_time = end
                for phase in PHASES:
                    state.totals[phase] += values[phase]
                    state.recent[phase].append(values[phase])
            pending = next(records, None)
        for rank in job.ranks:
            state = states[rank.rank]
            key = _labels(job, rank, job_label)
            record(f"fleetscope_training_steps_total{key}", state.steps)
            for phase in PHASES:
                record(f"fleetscope_training_{phase}_seconds_total{key}", state.totals[phase])
            record(f"fleetscope_training_tokens_total{key}", state.steps * 4096)
            for phase in PHASES:
                record(f"fleetscope_training_{phase}_seconds_median{key}", statistics.median(state.recent[phase]))
            record(f"fleetscope_training_last_step{key}", state.steps)
            record(f"fleetscope_training_last_step_timestamp_seconds{key}", state.last_step_time)
            record(f"fleetscope_training_last_push_timestamp_seconds{key}", math.floor(t))  # pushes every second
            record(f"fleetscope_training_rank_info{_info(job, rank, job_label)}", 1)
    return [{"series": name, "values": " ".join(_number(v) for v in values)} for name, values in samples.items()]


def gpu_series(job: Job, duration: float, scrape: float = 30.0, busy: float = 0.95,
               job_label: str = "fleetscope") -> list[dict[str, str]]:
    """Every rank's GPU, steadily busy: what NVML shows while the job trains."""
    count = int(duration // scrape)
    return [
        {"series": f'fleetscope_gpu_utilization_ratio{{job="{job_label}",instance="{r.instance}",gpu="{r.gpu}",'
                   f'uuid="GPU-{r.instance.split(":")[0]}-{r.gpu}"}}',
         "values": f"{busy}x{count}"}
        for r in job.ranks
    ]


def _labels(job: Job, rank: Rank, job_label: str) -> str:
    return (f'{{job="{job_label}",instance="{rank.instance}",training_job="{job.name}",rank="{rank.rank}",'
            f'local_rank="{rank.gpu}",pp_stage="{rank.pp_stage}"}}')


def _info(job: Job, rank: Rank, job_label: str) -> str:
    return _labels(job, rank, job_label)[:-1] + (
        f',dp_rank="{rank.rank}",world_size="{len(job.ranks)}",gpu="{rank.gpu}"}}')


def _number(value: float | None) -> str:
    if value is None:
        return "_"
    return f"{value:.7g}"


def rank_labels(job: Job, rank: int, **extra: str) -> dict[str, str]:
    """The labels a straggler alert of ``rank`` carries (``extra`` adds e.g. severity and cause)."""
    r = next(r for r in job.ranks if r.rank == rank)
    return {"job": "fleetscope", "instance": r.instance, "training_job": job.name, "rank": str(r.rank),
            "local_rank": str(r.gpu), "pp_stage": str(r.pp_stage), "gpu": str(r.gpu), **extra}


def promql_labels(labels: dict[str, Any]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


# -- measuring time to detect (python3 -m tests.alerts.sensitivity) ----------------------------------------


def first_firing(job: Job, duration: float, rules: str, *, scrape: float, evaluation: str) -> dict[str, float]:
    """alertname/rank -> seconds after ``job.onset`` the alert first fired, evaluated by promtool."""
    import re
    import tempfile
    from pathlib import Path

    import yaml

    test = {"promql_expr_test": [{
        "expr": f'min_over_time(timestamp(ALERTS{{alertstate="firing"}})[{duration:.0f}s:{evaluation}])',
        "eval_time": f"{duration:.0f}s", "exp_samples": [],  # fails on purpose: promtool prints what it got
    }], "interval": f"{scrape:.0f}s", "input_series": series(job, duration, scrape) + gpu_series(job, duration, scrape)}
    with tempfile.NamedTemporaryFile("w", suffix=".test.yml", delete=False) as handle:
        order = [g["name"] for g in yaml.safe_load(Path(rules).read_text(encoding="utf-8"))["groups"]]
        yaml.safe_dump({"rule_files": [rules], "evaluation_interval": evaluation, "group_eval_order": order,
                        "tests": [test]}, handle, width=1_000_000)
    result = promtool_test_rules(handle.name)
    found = {}
    for match in re.finditer(r'\{alertname="(\w+)"([^}]*)\} ([0-9.E+-]+)', result.stdout + result.stderr):
        rank = re.search(r'[ ,]rank="(\d+)"', match.group(2))
        found[f"{match.group(1)}/{rank.group(1) if rank else '-'}"] = float(match.group(3)) - job.onset
    return found


def main() -> int:
    """Time to detect a slower accelerator on the production rules, over several seeds and setups."""
    from pathlib import Path

    rules = str(Path(__file__).resolve().parents[2] / "alerts" / "fleetscope.rules.yml")
    # The training groups evaluate every 30 s whatever the global interval (training_evaluation_interval).
    setups = [("15 s scrape", 15.0, "1m"), ("30 s scrape", 30.0, "1m")]
    print("| slowdown (accelerator) | step | setup | time to detect (min / median / max over 8 runs) | missed |")
    print("|---|---|---|---|---|")
    for slowdown, limit in ((0.10, 300.0), (0.05, 600.0), (0.03, 900.0), (0.02, 900.0), (0.01, 900.0)):
        for step in (2.0, 5.0):
            for name, scrape, evaluation in setups:
                times, missed = [], 0
                for seed in range(8):
                    onset = 1200.0 + 11 * seed
                    job = Job("j", ranks_on(2, 4), step_seconds=step, slow_rank=5, slowdown=slowdown, onset=onset,
                              seed=seed)
                    fired = first_firing(job, onset + limit, rules, scrape=scrape, evaluation=evaluation)
                    if "TrainingStragglerRank/5" in fired:
                        times.append(fired["TrainingStragglerRank/5"])
                    else:
                        missed += 1
                spread = f"{min(times):.0f} / {statistics.median(times):.0f} / {max(times):.0f} s" if times else "-"
                print(f"| {slowdown:.0%} | {step:.0f} s | {name} | {spread} | {missed} of 8 within {limit:.0f} s |",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
