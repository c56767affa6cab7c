"""The detection run in virtual time: every fault class once on a 16-node cluster, a healthy cluster beside it.

The scenario of the live end-to-end run (``tests/e2e/test_detection.py``): 16 nodes alternating p5 and
p4d, 8 two-node jobs, 18 faults starting between t+45 s and t+96 s, 280 s in all, scraped and evaluated
every 5 s with the time-compressed rules (the ``e2e`` preset, ``fleetscope rules --preset e2e``). Each run
goes through :mod:`fleetscope_sim.virtual`; promtool says what fired and when, the same on every run.

``fleetscope simulate --virtual --report docs/detection-report.md`` writes the report from it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetscope_sim.cluster import ClusterSpec, make_cluster
from fleetscope_sim.detection import Outcome, Sighting, evaluate, expectation, render_report
from fleetscope_sim.faults import Fault, parse_schedule
from fleetscope_sim.tree import make_workdir
from fleetscope_sim.virtual import VirtualRun, fired_within, simulate

RUN_SECONDS = 280.0  # the last fault starts at t+96 s, so every limit is checked in full
RULES_FILE = "fleetscope.e2e.rules.yml"

# 16 nodes alternate p5 / p4d: job-a = node-00 (p5, ranks 0-7) + node-01 (p4d, ranks 8-15), job-b = node-02 + 03...
SCHEDULE: list[dict[str, Any]] = [
    {"kind": "thermal_throttle", "at": "45s", "node": "node-00", "gpu": 3},
    {"kind": "hw_slowdown", "at": "48s", "node": "node-02", "gpu": 5},
    {"kind": "slow_dataloader", "at": "51s", "job": "job-c", "rank": 12},
    {"kind": "job_hang", "at": "54s", "job": "job-d", "rank": 9, "params": {"phase": "data"}},
    {"kind": "rank_dies", "at": "57s", "job": "job-e", "rank": 6},
    {"kind": "xid", "at": "60s", "node": "node-10", "gpu": 1, "params": {"xid": 79}},
    {"kind": "xid", "at": "63s", "node": "node-11", "gpu": 2, "params": {"xid": 48}},
    {"kind": "xid", "at": "66s", "node": "node-12", "gpu": 0, "params": {"xid": 94}},
    {"kind": "xid", "at": "69s", "node": "node-13", "gpu": 7, "params": {"xid": 119}},
    {"kind": "ecc_uncorrectable", "at": "72s", "node": "node-14", "gpu": 4},
    {"kind": "row_remap_pending", "at": "75s", "node": "node-15", "gpu": 6},
    {"kind": "efa_retransmits", "at": "78s", "node": "node-06", "device": "rdmap96s0"},
    {"kind": "efa_impaired", "at": "81s", "node": "node-07", "device": "rdmap144s27"},
    {"kind": "efa_rx_drops", "at": "84s", "node": "node-04", "device": "rdmap130s0"},
    {"kind": "efa_device_missing", "at": "87s", "node": "node-09", "device": "rdmap160s27"},
    {"kind": "ena_pps_exceeded", "at": "90s", "node": "node-01", "device": "ens32"},
    {"kind": "ena_bw_exceeded", "at": "93s", "node": "node-03", "device": "ens32"},
    {"kind": "tcp_retransmit_storm", "at": "96s", "node": "node-12"},
]
FAULTS: tuple[Fault, ...] = tuple(parse_schedule({"faults": SCHEDULE}))  # sorted by start time


def fault_cluster(faults: Sequence[Fault] = FAULTS) -> ClusterSpec:
    return make_cluster(nodes=16, jobs=8, base_port=1, faults=list(faults))


def healthy_cluster() -> ClusterSpec:
    """A p5 and a p4d running one job, without faults (the fault run's untouched nodes and jobs are checked
    for stray alerts as well)."""
    return make_cluster(nodes=2, jobs=1, base_port=1, seed=2)


def rules_file(directory: str, name: str = RULES_FILE) -> str:
    """The generated rule file ``name`` (what ``fleetscope rules --write`` commits), written into ``directory``."""
    from fleetscope.rules.render import OUTPUTS, render
    from fleetscope.rules.settings import PRESETS

    preset, fmt, build = OUTPUTS[name]
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render(PRESETS[preset], fmt, preset, build))
    return path


@dataclass
class DetectionResult:
    fault_run: VirtualRun
    healthy_run: VirtualRun
    outcomes: list[Outcome]
    strays: list[Sighting]
    healthy: list[Sighting]

    def report(self) -> str:
        run, healthy = self.fault_run, self.healthy_run
        return render_report(self.outcomes, self.strays, self.healthy, {
            "Fault run": f"{len(run.spec.nodes)} nodes (p5.48xlarge and p4d.24xlarge alternating), "
                         f"{len(run.spec.jobs)} jobs of 16 ranks, {len(run.spec.faults)} faults",
            "Healthy run": f"{len(healthy.spec.nodes)} nodes, {len(healthy.spec.jobs)} "
                           f"job{'s' if len(healthy.spec.jobs) != 1 else ''}, no faults, same length",
            "Simulated time": f"{run.duration:.0f} s per run in virtual time (no sleeping); every node collected "
                              "on its daemon's schedule, scraped and the rules evaluated every 5 s",
            "Observed through": "the daemon's own collectors and exposition in process (kernel trees, the NVML "
                                "fake under the real pynvml binding, the push API's report parser)",
            "Rules": f"alerts/{RULES_FILE} (production thresholds, compressed windows), evaluated by promtool",
            "Series": f"{run.series} in the fault run, {healthy.series} in the healthy run (the names the rules read)",
        }, generated_by=("`fleetscope simulate --virtual` (sim/fleetscope_sim/detection_run.py) from one "
                         "virtual-time run of the simulated cluster, its alerts evaluated by promtool",
                         "`fleetscope simulate --virtual --report docs/detection-report.md`"))

    def problems(self) -> str:
        """What is wrong, in one line ("" when nothing)."""
        bad = [o.expectation.fault.label() for o in self.outcomes if not o.passed]
        failed = list(self.fault_run.result.failed) + list(self.healthy_run.result.failed)
        parts = [f"missed or late: {', '.join(bad)}" if bad else "",
                 f"{len(self.strays)} stray alert(s)" if self.strays else "",
                 f"{len(self.healthy)} alert(s) in the healthy run" if self.healthy else "",
                 f"{len(failed)} promtool check(s) failed" if failed else ""]
        return "; ".join(p for p in parts if p)


def detection_run(workdir: str | None = None) -> DetectionResult:
    """Both runs, their promtool verdicts, and the outcome of each fault."""
    base = workdir or make_workdir("fleetscope-detection-")
    try:
        rules = [rules_file(base)]
        spec = fault_cluster()
        expectations = [expectation(f, spec) for f in spec.faults]
        fault_run = simulate(spec, RUN_SECONDS, rules, lambda r: fired_within(expectations, r.end),
                             workdir=os.path.join(base, "faults"))
        healthy_run = simulate(healthy_cluster(), RUN_SECONDS, rules, workdir=os.path.join(base, "healthy"))
    finally:
        if workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    outcomes, strays = evaluate(expectations, fault_run.sightings, fault_run.recording.epoch)
    return DetectionResult(fault_run, healthy_run, outcomes, strays, healthy_run.sightings)


def write_report(output: str) -> int:
    """``fleetscope simulate --virtual --report FILE``: the report to ``output`` ("-": stdout); 1 if anything
    was missed, late, stray or failed its promtool check."""
    result = detection_run()
    text = result.report()
    if output == "-":
        print(text, end="")
    else:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text)
    problems = result.problems()
    if problems:
        print(f"fleetscope: {problems}", file=sys.stderr)
        return 1
    return 0
