"""Ended is ended (#39 item 1): no training alert becomes active for a job after its ranks ended or went silent.

For every alert family the training rules raise about a running job (stragglers of a rank and of a node, the
job's slowdown, an input-bound job and rank, a communication-bound job, idle GPUs), a job that shows it is
generated here as its node daemons export it, scrape by scrape (15 s), and ended twice: while the alert is
pending and after it fired. After its end a rank's series stay as the daemon keeps them (5 minutes: the
counters and medians frozen at their last values, phase ``ended``), then go stale. A job that goes silent
(its reports stop, no goodbye: frozen, cut off) keeps its frozen series and its last phase.

Each case replays through promtool on the production rules, evaluated every minute, and says: the alert was
active before the end (pending, or firing) as the case intends; no alert about the job is firing from a minute
after the end on, beyond a firing one's ``keep_firing_for``; none is active at all 3 minutes after the end
(the slow groups' interval); the goodput rules count no GPU-seconds lost to a job that ended.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetscope.promql import JOB_LOST_GPU_SECONDS, JOB_STALLED
from fleetscope.rules.settings import PRODUCTION, seconds
from fleetscope_sim.virtual import promtool_test_rules

from .rulefiles import ALERTS_DIR, group_order

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("CI"), reason="promtool not installed"
)

SCRAPE = 15
EVALUATION = 60  # seconds: the straggler records' own interval, and a multiple of every shorter one
KEPT_AFTER_END = 300  # the daemon keeps an ended rank's series this long
STALE = "stale"


@dataclass(frozen=True)
class Scenario:
    """A job of ``ranks`` ranks, ``per_node`` a node, with steps of ``step`` seconds; per rank, the share of its
    step it computes and waits for data; ``slower`` (minute, factor) stretches every rank's step from then on.
    ``alert``: the family (a regex of alert names) the job raises while it runs."""

    name: str
    alert: str
    ranks: int = 6
    per_node: int = 3
    step: float = 1.0
    compute: dict[int, float] = field(default_factory=dict)  # rank -> compute share of the step (default 0.8)
    data: dict[int, float] = field(default_factory=dict)  # rank -> data share of the step (default 0.02)
    busy: float = 0.95  # every rank's GPU utilization
    slower: tuple[float, float] | None = None
    pending_end: float = 5.5  # minutes: the job ends here while the alert is pending...
    firing_end: float = 20.5  # ...or here, after it fired (measured: first pending and firing, job running)

    def compute_share(self, rank: int) -> float:
        return self.compute.get(rank, 0.8)

    def data_share(self, rank: int) -> float:
        return self.data.get(rank, 0.02)


SCENARIOS = (
    # Ranks 4 and 5, two of the three on node-1, compute 10% longer: TrainingStragglerRank for each and
    # TrainingStragglerNode for node-1 (pending at 4m, firing at 5m).
    Scenario("stragglers", "TrainingStragglerRank|TrainingStragglerNode", compute={4: 0.88, 5: 0.88},
             pending_end=4.5, firing_end=8.5),
    # Every step 25% longer from 70m on: pending at 78m, firing at 93m (15m baseline an hour back).
    Scenario("slowdown", "TrainingJobSlowdown", slower=(70.0, 1.25), pending_end=85.5, firing_end=95.5),
    # Every rank waits 20% of its step for data: warning and critical pending at 1m, firing at 11m.
    Scenario("input", "TrainingInputBound", data=dict.fromkeys(range(6), 0.2), compute=dict.fromkeys(range(6), 0.7),
             firing_end=13.5),
    # Rank 1 alone waits 20%: pending at 2m, firing at 12m.
    Scenario("rank-input", "TrainingRankInputBound", data={1: 0.2}, firing_end=13.5),
    # Collectives take 38% of every rank's step: pending at 1m, firing at 16m.
    Scenario("comm", "TrainingCommunicationBound", compute=dict.fromkeys(range(6), 0.6), firing_end=17.5),
    # Every GPU 30% busy while the job steps: pending at 1m, firing at 31m.
    Scenario("idle-gpu", "TrainingLowGpuActivity", busy=0.3, firing_end=32.5),
)
# Their stop is the hang and silence rules': a job that went silent may be hung.
STOP_ALERTS = "TrainingJobHang|TrainingRankSilent|TrainingRankDead"


def instance(s: Scenario, rank: int) -> str:
    return f"node-{rank // s.per_node}:9402"


def labels(s: Scenario, job: str, rank: int) -> str:
    return (f'job="fleetscope",instance="{instance(s, rank)}",training_job="{job}",rank="{rank}",'
            f'local_rank="{rank % s.per_node}",pp_stage="0"')


def series(s: Scenario, job: str, end: float, *, silent: bool = False) -> list[dict[str, str]]:
    """What a scrape every 15 s sees of the job: running until ``end`` (s), then ended (or silent)."""
    last = int((end + KEPT_AFTER_END) // SCRAPE) + 8  # a few scrapes past the daemon's 5 minutes
    out: list[dict[str, str]] = []
    for rank in range(s.ranks):
        key = labels(s, job, rank)
        values: dict[str, list[float | str]] = {}
        totals = dict.fromkeys(("steps", "step", "compute", "data", "comm"), 0.0)
        last_push = 0.0
        for i in range(last + 1):
            t = float(i * SCRAPE)
            running = t <= end
            gone = t > end + KEPT_AFTER_END and not silent
            factor = s.slower[1] if s.slower and t > s.slower[0] * 60 else 1.0
            step = s.step * factor
            if running and i:
                n = SCRAPE / step
                totals["steps"] += n
                totals["step"] += n * step
                totals["compute"] += n * step * s.compute_share(rank)
                totals["data"] += n * step * s.data_share(rank)
                totals["comm"] += n * step * (1 - s.compute_share(rank) - s.data_share(rank))
                last_push = t - 0.5
            sample: dict[str, float | str] = {
                "fleetscope_training_steps_total": totals["steps"],
                "fleetscope_training_step_seconds_total": totals["step"],
                "fleetscope_training_compute_seconds_total": totals["compute"],
                "fleetscope_training_data_seconds_total": totals["data"],
                "fleetscope_training_comm_seconds_total": totals["comm"],
                "fleetscope_training_step_seconds_median": step,
                "fleetscope_training_compute_seconds_median": step * s.compute_share(rank),
                "fleetscope_training_data_seconds_median": step * s.data_share(rank),
                "fleetscope_training_comm_seconds_median": step * (1 - s.compute_share(rank) - s.data_share(rank)),
                "fleetscope_training_last_step": totals["steps"],
                "fleetscope_training_last_step_timestamp_seconds": last_push,
                "fleetscope_training_last_push_timestamp_seconds": last_push,
                f'fleetscope_training_phase{{{key},phase="compute"}}': 1.0 if running or silent else 0.0,
                f'fleetscope_training_phase{{{key},phase="ended"}}': 0.0 if running or silent else 1.0,
                "fleetscope_training_process_up": 1.0,
            }
            for name, value in sample.items():
                full = name if "{" in name else f"{name}{{{key}}}"
                values.setdefault(full, []).append(STALE if gone else value)
        info = f'fleetscope_training_rank_info{{{key},gpu="{rank % s.per_node}"}}'
        values[info] = [STALE if i * SCRAPE > end + KEPT_AFTER_END and not silent else 1.0 for i in range(last + 1)]
        out += [{"series": name, "values": " ".join(_text(v) for v in vs)} for name, vs in values.items()]
    for node in range(s.ranks // s.per_node):
        for gpu in range(s.per_node):
            busy = [s.busy if i * SCRAPE <= end else 0.0 for i in range(last + 1)]  # idle once the job ended
            out.append({"series": f'fleetscope_gpu_utilization_ratio{{job="fleetscope",instance="node-{node}:9402",'
                                  f'gpu="{gpu}",uuid="GPU-{node}-{gpu}"}}',
                        "values": " ".join(_text(v) for v in busy)})
        clock = f'fleetscope_push_scrape_timestamp_seconds{{job="fleetscope",instance="node-{node}:9402"}}'
        out.append({"series": clock, "values": f"0+{SCRAPE}x{last}"})
    return out


def _text(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.6g}"


def promtool(tmp_path: Path, name: str, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    document = {"rule_files": [str(ALERTS_DIR / "fleetscope.rules.yml")], "evaluation_interval": f"{EVALUATION}s",
                "group_eval_order": group_order(), "tests": tests}
    path = tmp_path / f"{name}.test.yml"
    path.write_text(yaml.safe_dump(document, width=1_000_000, sort_keys=False), encoding="utf-8")
    return promtool_test_rules(path)


def at(seconds_: float) -> str:
    return f"{seconds_:.0f}s"


def case(s: Scenario, state: str, how: str) -> dict[str, Any]:
    """One promtool test: the job ends (``how``: ended, silent) while its alert is ``state`` (pending, firing)."""
    end = (s.pending_end if state == "pending" else s.firing_end) * 60
    job = f"{s.name}-{how}-while-{state}"
    alerts = f'ALERTS{{training_job="{job}",alertname=~"{s.alert}"}}'
    names = s.alert.split("|")
    before = end - 30  # the last evaluation before the end
    # A goodbye is read raw by the alerts, at the next evaluation, and by the records that leave a stopped
    # rank out an evaluation later (promtool evaluates the groups in no fixed order); silence counts once the
    # last report is running_report_seconds old.
    after = end + 30 + EVALUATION
    if how == "silent":
        after += PRODUCTION.running_report_seconds
    resolved = after + seconds(PRODUCTION.keep_firing_for) + EVALUATION
    firing = f'ALERTS{{training_job="{job}",alertstate="firing"}}'
    others = f'ALERTS{{training_job="{job}",alertname!~"{s.alert}|{STOP_ALERTS}"}}'
    checks: list[dict[str, Any]] = [
        {"expr": f"max by (alertname, alertstate) ({alerts})", "eval_time": at(before),
         "exp_samples": [{"labels": f'{{alertname="{n}",alertstate="{state}"}}', "value": 1} for n in names]},
        # Nothing new after the end: a pending alert is gone, a firing one stays firing for keep_firing_for.
        {"expr": alerts, "eval_time": at(resolved), "exp_samples": []},
        # No other alert about the job, ever (a silent job's from the time it counts as silent on).
        {"expr": f"max_over_time({others}[{resolved if how == 'ended' else resolved - after:.0f}s])",
         "eval_time": at(resolved), "exp_samples": []},
    ]
    if how == "ended" or state == "firing":  # (a silent job's pending alert may fire before it counts as silent)
        checks.append({
            "expr": f"max by (alertname, alertstate) (max_over_time({alerts}[{resolved - after:.0f}s]))",
            "eval_time": at(resolved),
            "exp_samples": [] if state == "pending" else
            [{"labels": f'{{alertname="{n}",alertstate="firing"}}', "value": 1} for n in names],
        })
    if state == "pending" and how == "ended":  # it never fires: the alerts read the goodbye themselves
        checks.append({"expr": f"max_over_time({firing}[{resolved:.0f}s])", "eval_time": at(resolved),
                       "exp_samples": []})
    if how == "ended":  # a job that ended is no stalled job, and loses nothing
        checks += [
            {"expr": f'{JOB_STALLED}{{training_job="{job}"}}', "eval_time": at(after + 3 * EVALUATION),
             "exp_samples": []},
            {"expr": f'{JOB_LOST_GPU_SECONDS}{{training_job="{job}"}}', "eval_time": at(after + 3 * EVALUATION),
             "exp_samples": []},
        ]
    return {"name": f"{s.name}: the job {how} at {end / 60:g}m while {s.alert} was {state}",
            "interval": f"{SCRAPE}s", "input_series": series(s, job, end, silent=how == "silent"),
            "promql_expr_test": checks}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_no_alert_about_a_job_after_it_ended(scenario: Scenario, tmp_path: Path) -> None:
    hows = ("ended", "silent") if scenario.name == "stragglers" else ("ended",)
    tests = [case(scenario, state, how) for how in hows for state in ("pending", "firing")]
    result = promtool(tmp_path, scenario.name, tests)
    assert result.returncode == 0, (result.stdout + result.stderr)[-8000:]
