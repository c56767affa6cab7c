"""Real training, real detection: torch.distributed (gloo, CPU) jobs instrumented exactly as the README shows.

Every rank runs :mod:`tests.e2e.gloo_rank` (``StepTracker()``, ``tracker.watch(model)``,
``for batch in tracker.steps(loader)``) and pushes to its node's real daemon;
a real Prometheus evaluates the shipped rules (compressed preset). Faults are
made the way they happen (a slower accelerator, a slow or stuck loader, a killed
process), never by writing phase numbers, and each alert must name the job,
rank, node and GPU it is about. This run asks for plumbing and verdicts, not
times: how soon each rule fires and that nothing else does are promtool's, over
the recorded real DDP series (tests/alerts/recorded.test.yml) and the rules' own
cases (tests/alerts/training.test.yml). The 10% straggler's sensitivity is
tests/alerts/test_sensitivity.py, the client's measurement of a slow rank
tests/client/test_gloo_training.py.
"""

from __future__ import annotations

import contextlib

import pytest

from fleetscope_sim.harness import eventually
from tests.conftest import free_port, require_binary
from tests.e2e.training_jobs import cluster

pytest.importorskip("torch")

pytestmark = [pytest.mark.live, pytest.mark.timeout(900)]

# Steps of about 0.25 s (0.24 s of accelerator time, waited as a host waits on a CUDA sync): a run of about
# two and a half minutes. Long accelerator shares keep the host's part of a step (the ranks' CPU, about 8 ms
# of gloo and Python) small, so 16 ranks need half a core instead of one and parallel tests barely move a step.
DEVICE_MS = "240"
STEPS = 550


def test_fsdp_straggler_loader_bound_rank_hang_and_dead_rank_are_each_named() -> None:
    require_binary("prometheus")
    with cluster(nodes=2) as jobs:
        # Two ranks of each job per node: rank 3 is local rank 1 on node-01, its GPU 5.
        jobs.launch("fsdp-slow", 4, 2, free_port(), "--model", "fsdp2", "--steps", str(STEPS), "--slow-rank", "3",
                    "--device-ms", DEVICE_MS)
        # Two loader workers at 0.8 s a batch: 0.4 s per batch against a 0.25 s step.
        jobs.launch("loader-bound", 4, 2, free_port(), "--model", "ddp", "--steps", "350", "--data-rank", "1",
                    "--data-ms", "800", "--device-ms", DEVICE_MS)
        jobs.launch("hang", 4, 2, free_port(), "--model", "ddp", "--steps", "100000", "--stall-rank", "2",
                    "--fault-step", "200", "--device-ms", DEVICE_MS)
        jobs.launch("dead", 4, 2, free_port(), "--model", "ddp", "--steps", "100000", "--die-rank", "1",
                    "--fault-step", "200", "--device-ms", DEVICE_MS)
        codes = {job: jobs.wait(job, 600 if job == "fsdp-slow" else 60) for job in ("fsdp-slow", "loader-bound")}
        dead_codes = jobs.wait("dead", 30)
        with contextlib.suppress(TimeoutError):  # generous; the assertions below say what fired instead
            eventually(lambda: jobs.first_fired("TrainingJobHang", training_job="hang")
                       and jobs.first_fired("TrainingRankDead", training_job="dead"), 300, "the hang and the death")
        fired = jobs.fired()
        stalled, killed = jobs.fault_time("hang", 2), jobs.fault_time("dead", 1)
        assert codes == {"fsdp-slow": [0] * 4, "loader-bound": [0] * 4}, f"a rank failed; logs in {jobs.workdir}"
        assert dead_codes[1] == -9 and all(code not in (None, 0) for code in dead_codes), dead_codes
        assert stalled is not None and killed is not None, f"no fault happened; logs in {jobs.workdir}"

    def named(alertname: str) -> set[tuple[str, str, str, str | None]]:
        return {(a["training_job"], a["rank"], a["instance"], a.get("gpu"))
                for a in fired if a["alertname"] == alertname}

    assert named("TrainingStragglerRank") == {("fsdp-slow", "3", "node-01", "5")}, fired
    assert named("TrainingRankInputBound") == {("loader-bound", "1", "node-00", "1")}, fired
    assert named("TrainingJobHang") == {("hang", "2", "node-01", "4")}, fired
    assert {a.get("phase") for a in fired if a["alertname"] == "TrainingJobHang"} == {"data"}
    assert named("TrainingRankDead") == {("dead", "1", "node-00", "1")}, fired
    # Each fault is named where it is and nowhere else: no job-wide alert blames another job for it.
    faulted = {"fsdp-slow", "loader-bound", "hang", "dead"}
    assert all(a.get("training_job") in faulted for a in fired if "training_job" in a), fired
