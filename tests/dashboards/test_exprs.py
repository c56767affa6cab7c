"""The shared straggler PromQL does what the tables claim, evaluated by Prometheus's own engine.

``promtool test rules`` evaluates each expression over synthetic series: five
ranks of one job, each given exactly one node-side problem.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from fleetscope.dashboards import exprs, substitute
from tests.conftest import require_binary

MATCHERS = substitute('cluster=~"$cluster", training_job=~"$training_job"')

# rank -> (instance, gpu, compute median seconds)
RANKS = {
    "0": ("n1", "0", 1.0),  # healthy
    "1": ("n1", "1", 1.0),  # Xid on its GPU
    "2": ("n2", "0", 1.5),  # thermally throttled GPU, and 50% slower compute
    "3": ("n2", "1", 1.0),  # slow input pipeline
    "4": ("n3", "0", 1.0),  # node with EFA retransmits
}


def _series() -> list[dict[str, str]]:
    out = []
    for rank, (instance, gpu, compute) in RANKS.items():
        labels = f'training_job="j", pp_stage="0", rank="{rank}", local_rank="{rank}", instance="{instance}"'
        out += [
            {"series": f"fleetscope_training_compute_seconds_median{{{labels}}}", "values": f"{compute}x15"},
            {"series": f'fleetscope_training_rank_info{{{labels}, gpu="{gpu}", dp_rank="{rank}", world_size="5"}}',
             "values": "1x15"},
            {"series": f"fleetscope_training_steps_total{{{labels}}}", "values": "0+1x15"},
            {"series": f"fleetscope_training_step_seconds_total{{{labels}}}", "values": "0+60x15"},
            {"series": f"fleetscope_training_data_seconds_total{{{labels}}}",
             "values": "0+6x15" if rank == "3" else "0+0.6x15"},
        ]
    out += [
        {"series": 'fleetscope_gpu_xid_errors_total{instance="n1", gpu="1", uuid="u", xid="79", action="RESET_GPU"}',
         "values": "0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1"},
        {"series": 'fleetscope_gpu_throttle_seconds_total{instance="n2", gpu="0", uuid="u", reason="hw_thermal"}',
         "values": "0+30x15"},
        # Idle is not a slowdown.
        {"series": 'fleetscope_gpu_throttle_seconds_total{instance="n1", gpu="0", uuid="u", reason="gpu_idle"}',
         "values": "0+60x15"},
        {"series": 'fleetscope_efa_retransmit_packets_total{instance="n3", device="rdmap0", port="1"}',
         "values": "0+600x15"},
        {"series": 'fleetscope_efa_retransmit_packets_total{instance="n1", device="rdmap0", port="1"}',
         "values": "0x15"},
    ]
    return out


def _rank_labels(rank: str, *, with_gpu: bool = False) -> str:
    instance, gpu, _ = RANKS[rank]
    labels = f'{{instance="{instance}", pp_stage="0", rank="{rank}", training_job="j"'
    return labels + (f', gpu="{gpu}"}}' if with_gpu else "}")


def run_promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    promtool = require_binary("promtool")
    (tmp_path / "empty.rules.yml").write_text("groups: []\n")
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["empty.rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _series(), "promql_expr_test": tests}],
    }))
    result = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_relative_compute_is_against_the_stage_median(tmp_path: Path) -> None:
    run_promtool(tmp_path, [{
        "expr": f"max by (rank) ({exprs.relative_compute(MATCHERS)})", "eval_time": "10m",
        "exp_samples": [{"labels": f'{{rank="{r}"}}', "value": 1.5 if r == "2" else 1.0} for r in RANKS],
    }])


def test_likely_cause_picks_each_ranks_own_signal(tmp_path: Path) -> None:
    expected = {"0": 0, "1": 1, "2": 2, "3": 3, "4": 4}
    assert exprs.CAUSES[1][0].startswith("GPU Xid") and exprs.CAUSES[4][0].startswith("EFA")
    run_promtool(tmp_path, [{
        "expr": exprs.likely_cause(MATCHERS), "eval_time": "10m",
        "exp_samples": [{"labels": _rank_labels(r), "value": code} for r, code in expected.items()],
    }])


def test_worst_ranks_and_their_causes_share_labels(tmp_path: Path) -> None:
    run_promtool(tmp_path, [
        {"expr": exprs.worst_ranks(MATCHERS, 1), "eval_time": "10m",
         "exp_samples": [{"labels": _rank_labels("2", with_gpu=True), "value": 1.5}]},
        {"expr": exprs.cause_of_worst_ranks(MATCHERS, 1), "eval_time": "10m",
         "exp_samples": [{"labels": _rank_labels("2", with_gpu=True), "value": 2}]},
    ])


def test_mean_step_seconds(tmp_path: Path) -> None:
    run_promtool(tmp_path, [{
        "expr": exprs.mean_step_seconds(MATCHERS, "training_job"), "eval_time": "10m",
        "exp_samples": [{"labels": '{training_job="j"}', "value": 60}],
    }])
