"""``fleetscope rules``: print or write the rule files."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import yaml

from fleetscope.rules.render import FORMATS, OUTPUTS, render, stale_outputs, write_all
from fleetscope.rules.settings import PRESETS, Settings, SettingsError, with_values


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("rules", help="Print or write the Prometheus alerting and recording rules.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="production",
                        help="production, or e2e (time-compressed for the end-to-end simulation).")
    parser.add_argument("--format", choices=FORMATS, default="rules",
                        help="Plain Prometheus rule file, Kubernetes PrometheusRule, or a values file for the Helm "
                             "chart (deploy/helm/fleetscope: prometheusRule.groups and .settings).")
    parser.add_argument("--values", metavar="FILE", type=Path, action="append", default=[],
                        help="YAML mapping of settings over the preset: thresholds, windows, for: durations, "
                             "runbook_base_url, selector (names as in exporter/fleetscope/rules/settings.py, "
                             "e.g. 'straggler_for: 5m'). Repeatable; later files win.")
    parser.add_argument("--set", metavar="NAME=VALUE", action="append", default=[], dest="set_values",
                        help="One setting, after the values files (VALUE read as YAML: 1.2, 5m). Repeatable.")
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


def tuned(base: Settings, files: list[Path], assignments: list[str]) -> Settings:
    """``base`` with each values file, then each ``NAME=VALUE``, applied in order."""
    settings = base
    for path in files:
        try:
            values = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SettingsError(f"{path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if values is None:
            continue
        if not isinstance(values, dict):
            raise SettingsError(f"{path}: expected a mapping of setting names to values")
        settings = with_values(settings, values, str(path))
    for assignment in assignments:
        name, sep, text = assignment.partition("=")
        if not sep:
            raise SettingsError(f"--set {assignment}: expected NAME=VALUE")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        settings = with_values(settings, {name.strip(): value}, "--set")
    return settings


def run(args: argparse.Namespace) -> int:
    tuning = bool(args.values or args.set_values or args.selector is not None or args.keep_firing_for is not None)
    if tuning and (args.check is not None or args.write is not None):
        print("fleetscope rules: --write and --check produce the committed files; tune with --values "
              "when printing", file=sys.stderr)
        return 2
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
    try:
        settings = tuned(settings, args.values, args.set_values)
    except SettingsError as exc:
        print(f"fleetscope rules: {exc}", file=sys.stderr)
        return 2
    if args.values or args.set_values:
        name += " with " + ", ".join([*map(str, args.values), *(f"--set {a}" for a in args.set_values)])
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
