"""``fleetscope dashboards``: regenerate (or check) the committed dashboard JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def cmd_dashboards(args: argparse.Namespace) -> int:
    from fleetscope import dashboards

    try:
        import grafana_foundation_sdk  # noqa: F401  (only to give a clear message when it is missing)
    except ImportError:
        print("fleetscope dashboards needs grafana-foundation-sdk: pip install 'fleetscope[dashboards]'",
              file=sys.stderr)
        return 2
    directory = Path(args.output) if args.output else dashboards.default_directory()
    if args.check:
        out_of_date = dashboards.stale(directory)
        for name in out_of_date:
            print(f"out of date: {directory / name} (run `fleetscope dashboards`)", file=sys.stderr)
        return 1 if out_of_date else 0
    for path in dashboards.write(directory):
        print(path)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("dashboards", help="Write the Grafana dashboards JSON generated from code.")
    parser.add_argument("--output", default="", help="Directory to write (default: dashboards/ of the checkout).")
    parser.add_argument("--check", action="store_true", help="Only report files that differ; exit 1 if any.")
    parser.set_defaults(func=cmd_dashboards)
