"""Real torch jobs at production timing, recorded for promtool (#26 item 3).

    python -m tests.e2e.production_record record --out /tmp/production-jobs.json.gz   # ~13 minutes
    python -m tests.e2e.production_record write --raw tests/fixtures/recorded/production-jobs.json.gz

``record`` runs real ``torch.distributed`` (gloo, CPU) jobs (:mod:`tests.e2e.gloo_rank`) on real daemons,
scraped every 15 s (the shipped scrape configs) by a real Prometheus that evaluates the production rule
file (``alerts/fleetscope.rules.yml``) every 15 s, at the jobs' own pace: pauses that are not hangs (a
3-minute checkpoint, a declared one, a 5-minute evaluation, 90-second steps, an elastic restart under
torchrun with a slow checkpoint read) and a DDP hang (a rank's loader stops). It keeps what Prometheus
scraped of the training series, the alerts it fired and when each rank said its fault or pause happened.

``write`` turns a recording into promtool unit tests (``tests/alerts/recorded.test.yml``) on the
production rule file, so CI replays the real jobs' series through the production logic in seconds:
every sample at its scrape's place on a 15 s grid, each Unix-time value moved with its sample so that
its age at the scrape is the one recorded. The tests say: no TrainingJobHang on any pause, ever; the
hang's rank named, with its node, within 30 s of its loader's stall at the scrape's instant (60 s live: the
budget in docs/runbooks.md#trainingjobhang).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.training_jobs import PRODUCTION_RULES, ROOT, Cluster, cluster

SCRAPE = 15.0
KEPT = re.compile(r"fleetscope_training_.*|fleetscope_push_scrape_timestamp_seconds")
TEST_FILE = Path(ROOT) / "tests" / "alerts" / "recorded.test.yml"
# The hang's rank must be named within 60 s of its loader's stall on a live Prometheus. promtool evaluates at the
# scrape's instant, every group in the file's order; live, the hang's group evaluates up to an interval (15 s) after
# the scrape, and the scrape itself, the ingestion and the group's own evaluation on a busy node take the rest (up
# to 15 s). So the replay must name it within 30 s (docs/runbooks.md#trainingjobhang, the latency budget).
NAMED_WITHIN = 30.0


@dataclass(frozen=True)
class Job:
    name: str
    ranks: int
    per_node: int  # ranks per node (torchrun: all on one node)
    args: tuple[str, ...]
    torchrun: bool = False
    pause: bool = True  # a pause that must never be called a hang


# Steps of about 0.15-0.3 s on a busy 2-core machine: pauses begin after about two minutes of training.
JOBS = (
    Job("checkpoint", 4, 4, ("--steps", "1500", "--pause", "checkpoint", "--pause-step", "600",
                             "--pause-seconds", "180")),
    Job("checkpoint-declared", 4, 4, ("--steps", "1500", "--pause", "checkpoint-declared", "--pause-step", "600",
                                      "--pause-seconds", "180")),
    Job("evaluation", 4, 4, ("--steps", "1200", "--pause", "evaluation", "--pause-step", "600",
                             "--pause-seconds", "300")),
    Job("slow-steps", 2, 2, ("--steps", "7", "--device-ms", "90000")),
    Job("elastic", 4, 4, ("--steps", "2000", "--fail-rank", "1", "--fault-step", "700", "--save-every", "100",
                          "--slow-load-rank", "3", "--load-seconds", "60"), torchrun=True),
    Job("hang", 4, 2, ("--steps", "100000", "--stall-rank", "2", "--fault-step", "700"), pause=False),
)
RUN_SECONDS = 14 * 60.0
HANG_WATCH_SECONDS = 240.0  # the hang job is stopped this long after its fault


def record(out: str, base_port: int) -> None:
    nodes = sum(math.ceil(job.ranks / job.per_node) for job in JOBS)
    with cluster(nodes, rules=PRODUCTION_RULES, scrape_seconds=SCRAPE) as jobs:
        assert jobs.prometheus is not None
        started = time.time()
        node = 0
        for index, job in enumerate(JOBS):
            checkpoints = os.path.join(jobs.workdir, f"{job.name}-checkpoints")
            os.makedirs(checkpoints)
            args = (*job.args, "--checkpoint-dir", checkpoints)
            if job.torchrun:
                jobs.launch_torchrun(job.name, job.ranks, node, 1, *args)
            else:
                jobs.launch(job.name, job.ranks, job.per_node, base_port + nodes + 1 + index, *args, first_node=node)
            node += math.ceil(job.ranks / job.per_node)
        deadline = started + RUN_SECONDS
        while time.time() < deadline:
            running = [j.name for j in JOBS if any(p.poll() is None for p in jobs.ranks.get(j.name, []))]
            stalled = jobs.fault_time("hang", 2)
            if stalled is not None and time.time() > stalled + HANG_WATCH_SECONDS:
                running = [name for name in running if name != "hang"]
            if not running:
                break
            time.sleep(5)
        time.sleep(2 * SCRAPE)
        ended = time.time()
        assert jobs.watcher is not None
        jobs.watcher.poll()
        fired = [{"labels": s.labels, "first_firing": s.first_firing} for s in jobs.watcher.sightings.values()]
        window = f"{int(ended - started) + 60}s"
        data = jobs.prometheus._get("/api/v1/query", query=f'{{__name__=~"{KEPT.pattern}"}}[{window}]',
                                    time=f"{ended:.3f}")
        events = {job.name: _events(jobs, job) for job in JOBS}
        codes = {name: [p.poll() for p in procs] for name, procs in jobs.ranks.items()}
        logs = out.removesuffix(".json.gz") + "-logs"
        shutil.copytree(jobs.workdir, logs, ignore=shutil.ignore_patterns("prometheus", "*-checkpoints"))
    raw = {"started": started, "ended": ended, "scrape_seconds": SCRAPE, "rules": os.path.basename(PRODUCTION_RULES),
           "jobs": [{"name": j.name, "ranks": j.ranks, "per_node": j.per_node, "args": j.args, "torchrun": j.torchrun,
                     "pause": j.pause} for j in JOBS],
           "events": events, "exit_codes": codes, "alerts": fired, "series": data["result"]}
    with gzip.open(out, "wt", encoding="utf-8") as handle:
        json.dump(raw, handle, separators=(",", ":"))
    print(json.dumps({"alerts": fired, "events": events, "exit_codes": codes}, indent=1))


def _events(jobs: Cluster, job: Job) -> dict[str, list[float]]:
    """``fault``, ``pause`` (start, end) and ``restart`` times the job's ranks printed."""
    found: dict[str, list[float]] = {}
    logs = [jobs.log(job.name, 0)] if job.torchrun else [jobs.log(job.name, r) for r in range(job.ranks)]
    for path in logs:
        with open(path, encoding="utf-8", errors="replace") as log:
            text = log.read()
        for kind, values in re.findall(r"^(?:\[[^\]]*\]:)?(fault|pause|restart) ([\d. ]+)$", text, re.MULTILINE):
            found.setdefault(kind, []).extend(float(v) for v in values.split())
    return found


# -- promtool tests from a recording -------------------------------------------------------------------


def _number(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


STALE = "stale"  # what Prometheus writes when a series it scraped before is gone from a scrape


def encode(values: list[float | str | None]) -> str:
    """promtool's series notation: runs of a constant step as ``a+bxn``, gaps as ``_``, staleness as ``stale``."""
    out: list[str] = []
    i = 0
    while i < len(values):
        value = values[i]
        if value is None or value == STALE:
            n = 0
            while i + n + 1 < len(values) and values[i + n + 1] == value:
                n += 1
            token = "_" if value is None else STALE
            out.append(token if n == 0 else " ".join([token] * (n + 1)) if value == STALE else f"_x{n + 1}")
            i += n + 1
            continue
        assert isinstance(value, float)
        n = 0
        step = 0.0
        following = values[i + 1] if i + 1 < len(values) else None
        if isinstance(following, float):
            step = round(following - value, 3)
            while i + n + 1 < len(values):
                candidate = values[i + n + 1]
                if not isinstance(candidate, float) or abs(candidate - (value + (n + 1) * step)) >= 0.0015:
                    break
                n += 1
        if n == 0:
            out.append(_number(value))
            i += 1
        else:
            sign = "+" if step >= 0 else "-"
            out.append(f"{_number(value)}{sign}{_number(abs(step))}x{n}")
            i += n + 1
    return " ".join(out)


def grid_series(raw: dict[str, Any]) -> tuple[dict[str, list[float | str | None]], float]:
    """Each series on the 15 s grid from the first scrape; Unix-time values keep their age at the scrape; a
    series gone from a scrape is stale there (Prometheus's query API leaves its staleness markers out)."""
    first = min(float(v[0][0]) for s in raw["series"] for v in [s["values"]])
    length = 1 + max(round((float(v[-1][0]) - first) / SCRAPE) for s in raw["series"] for v in [s["values"]])
    out: dict[str, list[float | str | None]] = {}
    for series in raw["series"]:
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        values: list[float | str | None] = [None] * length
        for stamp, text in series["values"]:
            k = round((float(stamp) - first) / SCRAPE)
            value = float(text)
            if name.endswith("_timestamp_seconds"):
                value = value - float(stamp) + k * SCRAPE  # its age at the scrape, on the test's clock
            values[k] = value
        for k in range(1, length):
            if values[k] is None and isinstance(values[k - 1], float):
                values[k] = STALE
        inner = ",".join(f'{key}="{labels[key]}"' for key in sorted(labels))
        out[f"{name}{{{inner}}}"] = values
    return out, first


def write(raw_path: str, test_file: Path) -> None:
    with gzip.open(raw_path, "rt", encoding="utf-8") as handle:
        raw = json.load(handle)
    series, first = grid_series(raw)
    end = (len(next(iter(series.values()))) - 1) * SCRAPE
    tests: list[dict[str, Any]] = []
    for job in raw["jobs"]:
        name = job["name"]
        mine = {key: values for key, values in series.items() if f'training_job="{name}"' in key}
        instances = sorted({m.group(1) for key in mine for m in [re.search(r'instance="([^"]+)"', key)] if m})
        clocks = {key: values for key, values in series.items()
                  if key.startswith("fleetscope_push_scrape_timestamp_seconds")
                  and any(f'instance="{i}"' in key for i in instances)}
        hang = f'ALERTS{{alertname="TrainingJobHang",alertstate="firing",training_job="{name}"}}'
        checks: list[dict[str, Any]] = []
        events = raw["events"][name]
        if job["pause"]:
            whole = f"{int(end) + 60}s"
            checks.append({"expr": f"max_over_time({hang}[{whole}])", "eval_time": f"{int(end)}s", "exp_samples": []})
        else:
            stalled = min(events["fault"]) - first
            at = math.floor((stalled + NAMED_WITHIN) / SCRAPE) * SCRAPE  # the last evaluation within the budget
            ranks = [key for key in mine if key.startswith("fleetscope_training_rank_info") and 'rank="2"' in key]
            found = re.search(r'instance="([^"]+)"', ranks[0]) if ranks else None
            node = found.group(1) if found else ""
            checks.append({"expr": f'count by (training_job, rank, instance) ({hang})', "eval_time": f"{int(at)}s",
                           "exp_samples": [{"labels": f'{{instance="{node}",rank="2",training_job="{name}"}}',
                                            "value": 1}]})
        described = {kind: [round(t - first, 1) for t in times] for kind, times in events.items()}
        tests.append({
            "name": f"{name}: {json.dumps(described)} (s after the first scrape)",
            "interval": f"{int(SCRAPE)}s",
            "input_series": [{"series": key, "values": encode(values)}
                             for key, values in sorted({**mine, **clocks}.items())],
            "promql_expr_test": checks,
        })
    groups = yaml.safe_load((Path(ROOT) / "alerts" / "fleetscope.rules.yml").read_text(encoding="utf-8"))["groups"]
    document = {"rule_files": ["../../alerts/fleetscope.rules.yml"], "evaluation_interval": f"{int(SCRAPE)}s",
                "group_eval_order": [group["name"] for group in groups], "tests": tests}
    header = (
        "# Generated by `python -m tests.e2e.production_record write` from a recording of real torch jobs at\n"
        "# production timing (tests/fixtures/recorded/); do not edit. See tests/e2e/production_record.py.\n"
    )
    test_file.write_text(header + yaml.safe_dump(document, sort_keys=False, width=1_000_000), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", required=True)
    rec.add_argument("--base-port", type=int, default=19500, help="the torch jobs' rendezvous ports start here")
    wr = sub.add_parser("write")
    wr.add_argument("--raw", required=True)
    wr.add_argument("--test-file", default=str(TEST_FILE))
    args = parser.parse_args()
    if args.command == "record":
        record(args.out, args.base_port)
    else:
        write(args.raw, Path(args.test_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
