"""Real torch jobs with slightly slower ranks and healthy ones, recorded at production timing (#39 item 2).

    python -m tests.e2e.straggler_record record --out /tmp/stragglers.json.gz --minutes 100

``record`` runs real ``torch.distributed`` (gloo, CPU) DDP jobs (:mod:`tests.e2e.gloo_rank`, instrumented as
the README shows, pushing the client's real reports to real daemons) on two simulated nodes, scraped every 15 s
by a real Prometheus evaluating the production rule file, and keeps what Prometheus scraped of the training
series. Two healthy jobs run the whole time; beside them, one after the other, jobs whose rank 2 has a
1%, 2%, 3%, 5% and 10% longer accelerator share (a throttled GPU: only the wait stretches, not the host work).
Each job has 4 ranks, 2 on each node. The whole recording is meant to be cheap (about 0.3 of a core, at the
lowest CPU priority, which the recording did not set itself): the noise in it is the noise of the busy shared
machine it ran on (other processes, GC, the loader).
The recording is rewritten every ``--save-every`` seconds, so a cut-short run still leaves its data.

``tests/alerts/straggler_replay.py`` turns a recording into promtool tests on the production rules.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import time
from typing import Any

from fleetscope_sim.localhttp import get_json
from tests.e2e.training_jobs import PRODUCTION_RULES, Cluster, cluster

SCRAPE = 15.0
KEPT = re.compile(r"fleetscope_training_.*|fleetscope_push_scrape_timestamp_seconds")
DEVICE_MS = "400"  # steps of about 0.42 s: 12 ranks at a few ms of host work each stay well under half a core
SLOWDOWNS = (0.01, 0.02, 0.03, 0.05, 0.10)
SLOW_RANK = 2
HEALTHY = ("healthy-a", "healthy-b")


def snapshot(jobs: Cluster, started: float, out: str, meta: dict[str, Any]) -> None:
    assert jobs.prometheus is not None
    now = time.time()
    window = f"{int(now - started) + 60}s"
    try:  # a busy machine's Prometheus can take a while: a snapshot that fails is retried at the next one
        body = get_json(f"{jobs.prometheus.url}/api/v1/query", timeout=300.0,
                                params={"query": f'{{__name__=~"{KEPT.pattern}"}}[{window}]', "time": f"{now:.3f}"})
        data = body["data"]
    except (OSError, KeyError, TypeError) as error:
        print(f"snapshot failed: {error}", flush=True)
        return
    raw = {**meta, "started": started, "ended": now, "scrape_seconds": SCRAPE, "series": data["result"]}
    with gzip.open(out + ".tmp", "wt", encoding="utf-8") as handle:
        json.dump(raw, handle, separators=(",", ":"))
    os.replace(out + ".tmp", out)


def record(out: str, base_port: int, minutes: float, slow_minutes: float, save_every: float,
           slowdowns: tuple[float, ...] = SLOWDOWNS) -> None:
    steps_long = str(int(minutes * 60 / 0.3))  # more than fit: the healthy jobs are stopped at the end
    steps_slow = str(int(slow_minutes * 60 / 0.42))
    with cluster(2, base_port, rules=PRODUCTION_RULES, scrape_seconds=SCRAPE) as jobs:
        started = time.time()
        port = base_port + 3
        meta: dict[str, Any] = {"device_ms": float(DEVICE_MS), "slow_rank": SLOW_RANK, "jobs": []}
        for name in HEALTHY:
            jobs.launch(name, 4, 2, port, "--model", "ddp", "--steps", steps_long, "--device-ms", DEVICE_MS)
            meta["jobs"].append({"name": name, "slowdown": 0.0, "launched": time.time()})
            port += 1
        queue = list(slowdowns)
        current: str | None = None
        deadline = started + minutes * 60
        saved = time.time()
        while time.time() < deadline:
            if current is None or all(p.poll() is not None for p in jobs.ranks[current]):
                if current is not None:
                    meta["jobs"][-1]["codes"] = [p.poll() for p in jobs.ranks[current]]
                    meta["jobs"][-1]["finished"] = time.time()
                current = None
                if queue:
                    slowdown = queue.pop(0)
                    current = f"slow-{round(slowdown * 100)}pct"
                    jobs.launch(current, 4, 2, port, "--model", "ddp", "--steps", steps_slow, "--device-ms",
                                DEVICE_MS, "--slow-rank", str(SLOW_RANK), "--slowdown", str(slowdown))
                    meta["jobs"].append({"name": current, "slowdown": slowdown, "launched": time.time()})
                    port += 1
            if time.time() > saved + save_every:
                snapshot(jobs, started, out, meta)
                saved = time.time()
                print(f"saved at {time.time() - started:.0f}s: {[j['name'] for j in meta['jobs']]}", flush=True)
            time.sleep(5)
        snapshot(jobs, started, out, meta)
        print(json.dumps(meta, indent=1), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", required=True)
    rec.add_argument("--base-port", type=int, default=23800)
    rec.add_argument("--minutes", type=float, default=100.0)
    rec.add_argument("--slow-minutes", type=float, default=14.0)
    rec.add_argument("--save-every", type=float, default=300.0)
    rec.add_argument("--slowdowns", default=",".join(f"{x:g}" for x in SLOWDOWNS))
    args = parser.parse_args()
    record(args.out, args.base_port, args.minutes, args.slow_minutes, args.save_every,
           tuple(float(x) for x in args.slowdowns.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
