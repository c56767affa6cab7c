"""``fleetscope rules``: print or write the rule files."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from fleetscope.rules.render import OUTPUTS, render, stale_outputs, write_all
from fleetscope.rules.settings import PRESETS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("rules", help="Print or write the Prometheus alerting and recording rules.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="production",
                        help="production, or e2e (time-compressed for the end-to-end simulation).")
    parser.add_argument("--format", choices=["rules", "prometheusrule"], default="rules",
                        help="Plain Prometheus rule file or Kubernetes PrometheusRule.")
    parser.add_argument("--selector", default=None,
                        help='Label matchers selecting fleetscope targets (default: job="fleetscope"). With a '
                             'cluster matcher (job="fleetscope",cluster="east") the file is one shard: every '
                             "record it reads carries the matcher too, so shards can share a workspace.")
    parser.add_argument("--keep-firing-for", metavar="DURATION", default=None,
                        help='keep_firing_for of every alert (default 2m); "" leaves the field out, for '
                             "rulers older than Prometheus 2.42.")
    parser.add_argument("--write", metavar="DIR", type=Path, default=None,
                        help=f"Write the committed files ({', '.join(OUTPUTS)}) into DIR.")
    parser.add_argument("--check", metavar="DIR", type=Path, default=None,
                        help="Exit 1 if the files in DIR differ from the generator's output.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.check is not None:
        stale = stale_outputs(args.check)
        for name in stale:
            print(f"{args.check / name} is out of date; run: fleetscope rules --write {args.check}", file=sys.stderr)
        return 1 if stale else 0
    if args.write is not None:
        for path in write_all(args.write):
            print(path)
        return 0
    settings = PRESETS[args.preset]
    name = args.preset
    if args.selector is not None:
        settings = dataclasses.replace(settings, selector=args.selector)
        name += " with custom selector"
    if args.keep_firing_for is not None:
        settings = dataclasses.replace(settings, keep_firing_for=args.keep_firing_for)
        name += f" with keep_firing_for {args.keep_firing_for!r}"
    sys.stdout.write(render(settings, args.format, name))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (alerts/generate.py) that does not build the whole ``fleetscope`` CLI."""
    parser = argparse.ArgumentParser(prog="fleetscope")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["rules", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))
