"""Straggler sensitivity on the production rules, evaluated by promtool over generated noisy runs.

Each scenario is a synchronous job from :mod:`tests.alerts.sensitivity` (per-step
noise, a rank slower in its accelerator share, checkpoints, drift, stages of
different cost), scraped every 15 s like the shipped Prometheus configurations
(deploy/prometheus, the ServiceMonitor) and evaluated every 30 s, the training
rule groups' own interval. Steps take
5 s where the time to detect is checked: the daemon's 32-step rolling median
then lags 80 s, more than with most real step times.

``ALERTS`` is queryable in a promtool test, so "no alert in two hours" is one
assertion over the whole run, pending alerts included.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetscope.promql import JOB_COMM_SHARE, JOB_MIN_COMM_SHARE, STRAGGLERS
from fleetscope_sim.virtual import promtool_test_rules

from .rulefiles import ALERTS_DIR, group_order
from .sensitivity import Job, gpu_series, promql_labels, rank_labels, ranks_on, series

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("CI"), reason="promtool not installed"
)

SCRAPE = 15.0  # the shipped Prometheus configurations (deploy/prometheus, the ServiceMonitor)
EVALUATION = "1m"  # the straggler records' own interval (Settings.straggler_sample_window)
ONSET = 1200.0  # the slow rank turns slow 20 minutes in: the history before it is healthy


def run_promtool(tmp_path: Path, name: str, input_series: list[dict[str, str]], *,
                 alert_tests: list[dict[str, Any]] = (), expr_tests: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
    document = {
        "rule_files": [str(ALERTS_DIR / "fleetscope.rules.yml")],
        "evaluation_interval": EVALUATION,
        "group_eval_order": group_order(),
        "tests": [{"name": name, "interval": f"{SCRAPE:.0f}s", "input_series": input_series,
                   "alert_rule_test": list(alert_tests), "promql_expr_test": list(expr_tests)}],
    }
    path = tmp_path / f"{name}.test.yml"
    path.write_text(yaml.safe_dump(document, width=1_000_000, sort_keys=False), encoding="utf-8")
    result = promtool_test_rules(path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


def at(seconds: float) -> str:
    return f"{seconds:.0f}s"


def firing(labels: dict[str, str]) -> dict[str, Any]:
    return {"labels": "ALERTS" + promql_labels({"alertstate": "firing", **labels}), "value": 1}


def throttled_gpu(job: Job, rank: int, share: float, since: float, duration: float) -> dict[str, str]:
    """The GPU of ``rank`` held down by hw_thermal for ``share`` of the time from ``since`` on."""
    r = next(r for r in job.ranks if r.rank == rank)
    quiet = int(since // SCRAPE)
    rising = int((duration - since) // SCRAPE)
    return {"series": f'fleetscope_gpu_throttle_seconds_total{{job="fleetscope",instance="{r.instance}",'
                      f'gpu="{r.gpu}",uuid="GPU-x",reason="hw_thermal"}}',
            "values": f"0x{quiet} 0+{share * SCRAPE:g}x{rising}"}


def test_healthy_job_stays_silent_for_two_hours(tmp_path: Path) -> None:
    """±3% per-step noise, a 30 s checkpoint in rank 0's compute every 300 steps, a 2% slowdown shared by
    every rank, and two pipeline stages, the second 30% dearer: no alert fires or even goes pending,
    and the straggler rule flags no rank at any evaluation."""
    duration = 7200.0
    job = Job("healthy", ranks_on(2, 4, stages=2), step_seconds=2.0, stage_cost=(1.0, 1.3),
              checkpoint_every=300, checkpoint_seconds=30.0, drift=0.02, seed=7)
    run_promtool(tmp_path, "healthy", series(job, duration, SCRAPE) + gpu_series(job, duration, SCRAPE), expr_tests=[
        {"expr": "count_over_time(ALERTS[2h])", "eval_time": at(duration), "exp_samples": []},
        {"expr": f"count_over_time({STRAGGLERS}[2h])", "eval_time": at(duration), "exp_samples": []},
    ])


@pytest.mark.parametrize(("slowdown", "limit", "step"), [(0.10, 300.0, 5.0), (0.05, 600.0, 5.0), (0.02, 600.0, 2.0)],
                         ids=["10pct", "5pct", "2pct"])
def test_slow_accelerator_is_named_in_time(tmp_path: Path, slowdown: float, limit: float, step: float) -> None:
    """A rank whose accelerator work is 10% (5%, 2%) slower, ±3% noise: named within 5 (10, 10) minutes with
    its rank, node, GPU and cause, and nothing else fires. The 10% rank's GPU is thermally throttled (cause
    gpu_throttled); nothing explains the others (cause unknown)."""
    duration = ONSET + limit
    job = Job("slow", ranks_on(2, 4), step_seconds=step, slow_rank=5, slowdown=slowdown, onset=ONSET, seed=3)
    inputs = series(job, duration, SCRAPE) + gpu_series(job, duration, SCRAPE)
    cause = "unknown"
    if slowdown >= 0.10:
        inputs.append(throttled_gpu(job, 5, 0.3, ONSET, duration))
        cause = "gpu_throttled"
    expected = rank_labels(job, 5, alertname="TrainingStragglerRank", severity="warning", cause=cause)
    run_promtool(tmp_path, f"slow-{slowdown}", inputs, expr_tests=[
        {"expr": "count_over_time(ALERTS[20m])", "eval_time": at(ONSET), "exp_samples": []},
        {"expr": 'ALERTS{alertstate="firing"}', "eval_time": at(duration), "exp_samples": [firing(expected)]},
    ])


def test_peers_waiting_on_a_rank_below_the_threshold_is_not_communication_bound(tmp_path: Path) -> None:
    """A rank 0.7% slower (below the straggler floor of 1%) in a job whose collectives take 24% of the step:
    its peers wait over 25% of each step, the median rank too (what a rule on the median rank reads as a
    network problem), but the rank that waits least stays below 25%. Nothing fires; the rank is not flagged.
    Per-step noise is 1% here: this case is about where the wait lands, not about noise."""
    duration = 3600.0
    job = Job("peerwait", ranks_on(2, 4), step_seconds=2.0, compute_share=0.74, data_share=0.02, noise=0.01,
              slow_rank=5, slowdown=0.007, onset=0.0, seed=11)
    run_promtool(tmp_path, "peer-wait", series(job, duration, SCRAPE) + gpu_series(job, duration, SCRAPE), expr_tests=[
        {"expr": "count_over_time(ALERTS[1h])", "eval_time": at(duration), "exp_samples": []},
        {"expr": f"count_over_time({STRAGGLERS}[1h])", "eval_time": at(duration), "exp_samples": []},
        {"expr": f"{JOB_COMM_SHARE} > bool 0.25", "eval_time": at(duration),
         "exp_samples": [{"labels": '{training_job="peerwait"}', "value": 1}]},
        {"expr": f"{JOB_MIN_COMM_SHARE} < bool 0.25", "eval_time": at(duration),
         "exp_samples": [{"labels": '{training_job="peerwait"}', "value": 1}]},
    ])
