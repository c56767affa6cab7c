"""Run the benchmark suite and regenerate ``docs/benchmarks.md``.

    python3 benchmarks/run.py              # full run (about 20 minutes)
    python3 benchmarks/run.py --quick      # smoke test: every part, tiny durations
    python3 benchmarks/run.py --parts side,idle --out /tmp/bench.md
    python3 benchmarks/run.py --parts gpu --update   # only section 6c (and its headline row), the rest kept

Needs the fleetscope package installed (``pip install -e .``) and, for the
side-by-side parts, the Debian packages prometheus-node-exporter, prometheus
and prometheus-pushgateway (a missing binary skips its comparison and says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import gpu_cost, measure, nccl, report, scrape
from benchmarks.harness import REPO_ROOT, find_binary

# Each part: (name, what it measures, how to run it into the results). Run in this order.
PARTS: tuple[tuple[str, str, Callable[[report.Results, Callable[[str], None], bool], None]], ...] = (
    ("side", "scrape cost beside node_exporter (#16), repeated",
     lambda r, log, quick: setattr(r, "side", scrape.measure_side_by_side(r.scrape_settings, log))),
    ("prometheus", "the same pair scraped by a real Prometheus",
     lambda r, log, quick: setattr(r, "prometheus", scrape.measure_prometheus(r.scrape_settings, log))),
    ("idle", "idle cost and the number of scrapers",
     lambda r, log, quick: setattr(r, "idle", scrape.measure_idle(r.scrape_settings, log))),
    ("path", "what a scrape and a reading cost",
     lambda r, log, quick: setattr(r, "path", scrape.measure_scrape_path(r.scrape_settings, log))),
    ("node", "node variants: sustained CPU/RSS, series, ingest, bursts",
     lambda r, log, quick: setattr(r, "node", measure.measure_node(r.settings, log))),
    ("push", "push endpoint vs Pushgateway, client cost",
     lambda r, log, quick: setattr(r, "push", measure.measure_push(r.settings, log))),
    ("nccl", "series per node with the NCCL Inspector, reading cost",
     lambda r, log, quick: setattr(r, "nccl", nccl.measure(5_000 if quick else 50_000))),
    ("gpu", "the GPU collector per cycle on the H100 NVML latency model",
     lambda r, log, quick: setattr(r, "gpu", gpu_cost.measure_for_report(6 if quick else 60))),
    ("profiles", "cProfile of the scrape path and the collectors",
     lambda r, log, quick: setattr(r, "profiles", measure.measure_profiles(r.settings, 5 if quick else 30, log))),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Tiny durations: checks the suite, not the figures.")
    parser.add_argument("--duration", type=float, default=None,
                        help="Seconds of the sustained CPU/RSS run (default 60; --quick: 2).")
    parser.add_argument("--scrape-seconds", type=float, default=None,
                        help="Seconds of each side-by-side run (default 120; --quick: 2).")
    parser.add_argument("--repeat", type=int, default=None, help="Side-by-side runs (default 3; --quick: 1).")
    parser.add_argument("--parts", default=",".join(name for name, _, _ in PARTS),
                        help="Comma-separated parts to run: " + ", ".join(name for name, _, _ in PARTS) + ".")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "docs", "benchmarks.md"),
                        help="Report to write (default docs/benchmarks.md).")
    parser.add_argument("--update", action="store_true",
                        help="Measure only --parts and put their sections (and headline rows) into the report "
                             "--out already holds, keeping the rest (parts: "
                             + ", ".join(report.UPDATABLE) + ").")
    parser.add_argument("--workdir", default=None, help="Trees and logs (default: a temporary directory, removed).")
    parser.add_argument("--node-exporter", default=None, help="node_exporter binary.")
    parser.add_argument("--pushgateway", default=None, help="Pushgateway binary.")
    args = parser.parse_args(argv)
    known = {name for name, _, _ in PARTS}
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = sorted(set(args.parts) - known)
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from {sorted(known)}")
    if args.update:
        cannot = sorted(set(args.parts) - set(report.UPDATABLE))
        if cannot:
            parser.error(f"--update cannot update {cannot}: their sections feed the headline, the misses and the "
                         "Kubernetes resources; run them in full")
        if args.quick:
            parser.error("--update writes real figures into the report; not with --quick")
        if not os.path.exists(args.out):
            parser.error(f"--update: no report at {args.out} to update")
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration must be > 0")
    if args.scrape_seconds is not None and args.scrape_seconds <= 0:
        parser.error("--scrape-seconds must be > 0")
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Trees on tmpfs when there is one: sysfs is in memory too, so no disk I/O is measured.
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    workdir = args.workdir or tempfile.mkdtemp(prefix="fleetscope-bench-", dir=scratch)
    os.makedirs(workdir, exist_ok=True)
    node_exporter = args.node_exporter or find_binary("prometheus-node-exporter", "/usr/bin/prometheus-node-exporter")
    pushgateway = args.pushgateway or find_binary("prometheus-pushgateway", "/usr/bin/prometheus-pushgateway")
    base = measure.Settings.quick(workdir) if args.quick else measure.Settings(workdir)
    overrides: dict[str, Any] = {"node_exporter": node_exporter, "pushgateway": pushgateway}
    if args.duration is not None:
        overrides["sustained_seconds"] = args.duration
    settings = dataclasses.replace(base, **overrides)
    scrape_base = (scrape.ScrapeSettings.quick(workdir, node_exporter) if args.quick
                   else scrape.ScrapeSettings(workdir, node_exporter=node_exporter))
    scrape_overrides: dict[str, Any] = {}
    if args.scrape_seconds is not None:
        scrape_overrides["seconds"] = args.scrape_seconds
    if args.repeat is not None:
        scrape_overrides["repeats"] = args.repeat
    scrape_settings = dataclasses.replace(scrape_base, **scrape_overrides)

    started = time.monotonic()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results = report.Results(settings, scrape_settings, measure.environment(settings))
    chosen = [part for part in PARTS if part[0] in args.parts]
    failed: list[str] = []
    try:
        for i, (name, what, run) in enumerate(chosen, 1):
            print(f"[{i}/{len(chosen)}] {what}", flush=True)
            try:
                run(results, _log, args.quick)
            except Exception as exc:  # one failed part (a daemon too slow to start on a busy machine) loses only itself
                print(f"  part {name} failed: {exc!r}; its section says 'not run'", flush=True)
                failed.append(name)
        results.env.load_after = measure.load_average()
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.update:
        if failed:
            print("nothing updated: a part failed")
            return 1
        with open(args.out, encoding="utf-8") as handle:
            text = report.update(handle.read(), results, args.parts, date, time.monotonic() - started)
    else:
        text = report.render(results, date, args.quick, time.monotonic() - started)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"wrote {args.out} ({time.monotonic() - started:.0f} s)"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def _log(message: str) -> None:
    print(message, flush=True)


if __name__ == "__main__":
    sys.exit(main())
