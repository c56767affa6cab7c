"""Run the whole benchmark suite and regenerate ``docs/benchmarks.md``.

    python3 benchmarks/run.py              # full run (about 2.5 minutes)
    python3 benchmarks/run.py --quick      # smoke test: every section, tiny durations
    python3 benchmarks/run.py --duration 300 --out /tmp/bench.md

Needs the fleetscope package installed (``pip install -e .``) and, for the
side-by-side sections, the Debian packages prometheus-node-exporter and
prometheus-pushgateway (a missing binary skips its comparison and says so).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import measure, report
from benchmarks.harness import REPO_ROOT, find_binary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Tiny durations: checks the suite, not the figures.")
    parser.add_argument("--duration", type=float, default=None,
                        help="Seconds of the sustained CPU/RSS run (default 60; --quick: 3).")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "docs", "benchmarks.md"),
                        help="Report to write (default docs/benchmarks.md).")
    parser.add_argument("--workdir", default=None, help="Trees and logs (default: a temporary directory, removed).")
    parser.add_argument("--node-exporter", default=None, help="node_exporter binary.")
    parser.add_argument("--pushgateway", default=None, help="Pushgateway binary.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Trees on tmpfs when there is one: sysfs is in memory too, so no disk I/O is measured.
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    workdir = args.workdir or tempfile.mkdtemp(prefix="fleetscope-bench-", dir=scratch)
    os.makedirs(workdir, exist_ok=True)
    base = measure.Settings.quick(workdir) if args.quick else measure.Settings(workdir)
    overrides: dict[str, object] = {
        "node_exporter": args.node_exporter or find_binary("prometheus-node-exporter",
                                                           "/usr/bin/prometheus-node-exporter"),
        "pushgateway": args.pushgateway or find_binary("prometheus-pushgateway", "/usr/bin/prometheus-pushgateway"),
    }
    if args.duration is not None:
        if args.duration <= 0:
            raise SystemExit("--duration must be > 0")
        overrides["sustained_seconds"] = args.duration
    import dataclasses

    settings = dataclasses.replace(base, **overrides)  # type: ignore[arg-type]
    started = time.monotonic()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    try:
        env = measure.environment(settings)
        print("[1/4] node: sustained run, latency, series, ingest", flush=True)
        node = measure.measure_node(settings, log=_log)
        print("[2/4] network collectors vs node_exporter", flush=True)
        net = measure.measure_network(settings, log=_log)
        print("[3/4] push endpoint vs Pushgateway, client cost", flush=True)
        push = measure.measure_push(settings, log=_log)
        print("[4/4] profiles", flush=True)
        profiles = measure.measure_profiles(settings, calls=5 if args.quick else 30, log=_log)
        env.load_after = measure.load_average()
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    text = report.render(settings, env, date, node, net, push, profiles, args.quick, time.monotonic() - started)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"wrote {args.out} ({time.monotonic() - started:.0f} s)")
    return 0


def _log(message: str) -> None:
    print(message, flush=True)


if __name__ == "__main__":
    sys.exit(main())
