"""The ``fleetscope`` command.

    fleetscope serve     run the daemon
    fleetscope check     one-shot node health verdict (exit 0 healthy, 1 unhealthy, 2 could not tell)
    fleetscope catalog   write the metric catalog (docs/metrics.md)

Flags follow node_exporter: ``--web.listen-address``, ``--path.sysfs``,
``--collector.<name>`` / ``--no-collector.<name>``... Every flag is also an
environment variable (``FLEETSCOPE_...``) and a key in the ``--config`` YAML.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from fleetscope import __version__
from fleetscope.config import Config, ConfigError, load, settings_table
from fleetscope.logs import setup_logging

# Subcommands beyond the core ones, as import strings of ``register(subparsers)``
# functions, so their (heavier) modules load only when the CLI is built.
EXTRA_COMMANDS: dict[str, str] = {
    "capture": "fleetscope.capture.cli:register",
    "rules": "fleetscope.rules.cli:register",
    "dashboards": "fleetscope.dashboards.cli:register",
}
# Other distributions add subcommands through this entry-point group: name = the command,
# value = "module:register" (fleetscope-sim, sim/pyproject.toml, adds simulate, demo, simulate-node).
COMMAND_ENTRY_POINTS = "fleetscope.commands"
# The repository's own add-on commands: when their distribution is not installed, the command
# still exists and says in one line what to install.
ADD_ON_HINTS: dict[str, str] = dict.fromkeys(
    ("simulate", "demo", "simulate-node"),
    "the simulator is the fleetscope-sim distribution: pip install ./sim from the fleetscope repository "
    "(bash scripts/demo installs it)",
)

EXIT_CONFIG = 3
logger = logging.getLogger(__name__)


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, defaulting to "not given" so precedence over env/YAML is exact."""
    parser.add_argument("--config", metavar="FILE", default=None, help="YAML configuration file.")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for key, info in settings_table().items():
        section = key.split(".")[0]
        group = groups.setdefault(section, parser.add_argument_group(f"{section} settings"))
        kwargs: dict[str, Any] = {"dest": "setting:" + key, "default": argparse.SUPPRESS}
        if info.is_bool:
            group.add_argument(f"--{key}", action=argparse.BooleanOptionalAction,
                               help=f"{info.help} (default: {info.default}; env {info.env})", **kwargs)
        else:
            default = ",".join(map(str, info.default)) or "none" if isinstance(info.default, tuple) else info.default
            group.add_argument(f"--{key}", metavar="VALUE",
                               help=f"{info.help} (default: {default!s}; env {info.env})", **kwargs)


def config_from_args(args: argparse.Namespace) -> Config:
    flags = {name.removeprefix("setting:"): value for name, value in vars(args).items() if name.startswith("setting:")}
    return load(flags, yaml_path=args.config)


def cmd_serve(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    setup_logging(config.log)
    from prometheus_client import ProcessCollector

    from fleetscope.serve.daemon import build_daemon

    if getattr(args, "setting:push.token", "").strip():
        logger.warning(
            "--push.token is readable by every user of this node (/proc/%d/cmdline): use --push.token-file "
            "(a 0600 file) or FLEETSCOPE_PUSH_TOKEN instead", os.getpid())
    # process_* (resident memory, CPU seconds, open file descriptors, ...) of this process, read from /proc/self
    daemon = build_daemon(config, process=ProcessCollector(registry=None))
    logger.info(
        "fleetscope %s starting on %s (collectors: %s)", __version__, config.web.listen_address,
        ", ".join(daemon.collectors) or "none",
    )
    asyncio.run(daemon.serve())
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 healthy, 1 unhealthy (a real finding), 2 could not tell: anything unexpected is a 2.

    A Slurm health check drains the node on 1 and node-problem-detector sets a condition True on it, so a
    crash of the checker itself must never read as 1. With ``--condition`` the verdict is one line of at
    most 80 characters (node-problem-detector's condition message); every finding goes to stderr.
    """
    from fleetscope.check.run import EXIT_UNKNOWN, run_check, summary, watch
    from fleetscope.check.verdicts import CONDITIONS

    if args.every and not args.write:
        print("fleetscope check: --every needs --write", file=sys.stderr)
        return EXIT_UNKNOWN
    try:
        config = config_from_args(args)
        setup_logging(config.log, quiet=True)  # the verdict goes to stdout
        if args.write:
            watch(config, args.write, args.every or 0.0, args.timeout or WATCH_TIMEOUT,
                  rounds=None if args.every else 1)
            return 0
        if args.condition:
            timeout = args.timeout or CONDITION_TIMEOUT
            findings, code = run_check(config, timeout=timeout, condition=CONDITIONS[args.condition],
                                       close_grace=CONDITION_CLOSE_GRACE)
            print(summary(findings, code))
            for finding in findings:
                print(finding.line(), file=sys.stderr)
            return code
        findings, code = run_check(config, timeout=args.timeout or CHECK_TIMEOUT)
        for finding in findings:
            print(finding.line())
        if code == 0:
            print("HEALTHY")
        return code
    except ConfigError as exc:
        message = f"configuration error: {exc}"
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
    from fleetscope.collectors.protocol import one_line

    message = one_line(message)
    if args.condition:  # the one line node-problem-detector shows
        print(f"could not tell: {message}"[:80])
    print(f"fleetscope check: could not tell: {message}", file=sys.stderr)
    return EXIT_UNKNOWN


# Seconds a check may take: the whole node (Slurm's HealthCheckProgram waits 60 s), one condition
# (node-problem-detector kills a plugin after 5 s: start-up and closing must fit beside it), one round of
# verdict files.
CHECK_TIMEOUT = 20.0
CONDITION_TIMEOUT = 3.0
CONDITION_CLOSE_GRACE = 0.5
WATCH_TIMEOUT = 10.0


def positive_seconds(text: str) -> float:
    """A finite number of seconds above zero (argparse refuses anything else as bad input)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds above 0, got {text!r}")
    return value


def cmd_catalog(args: argparse.Namespace) -> int:
    from fleetscope.metrics.catalog import render_catalog

    text = render_catalog()
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetscope", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"fleetscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="Run the node daemon.")
    add_setting_flags(serve)
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser("check", help="One-shot node health verdict: exit 0 healthy, 1 unhealthy, 2 unknown.")
    add_setting_flags(check)
    check.add_argument("--timeout", type=positive_seconds, default=None,
                       help="Seconds the whole check may take; a collector still reading then counts as unknown "
                            f"(default {CHECK_TIMEOUT:g}, {CONDITION_TIMEOUT:g} with --condition, "
                            f"{WATCH_TIMEOUT:g} with --write).")
    mode = check.add_mutually_exclusive_group()
    mode.add_argument("--condition", choices=("gpu", "efa", "training"), default=None,
                      help="Report one node condition as a node-problem-detector plugin: exit 0/1/2 and one line "
                           "of at most 80 characters.")
    mode.add_argument("--write", metavar="DIR", default=None,
                      help="Write one verdict file per condition (gpu, efa, training) into DIR.")
    check.add_argument("--every", type=positive_seconds, default=None, metavar="SECONDS",
                       help="With --write: write the verdict files again every SECONDS, for ever.")
    check.set_defaults(func=cmd_check)

    catalog = sub.add_parser("catalog", help="Write the metric catalog generated from the metric tables.")
    catalog.add_argument("--output", default="docs/metrics.md", help="File to write, or - for stdout.")
    catalog.set_defaults(func=cmd_catalog)

    for target in EXTRA_COMMANDS.values():
        _load_register(target)(sub)
    added = add_on_commands()
    for name, target in added.items():
        try:
            register = _load_register(target)
        except ImportError as exc:  # installed but broken: the command says so, the others still work
            _missing_command(sub, name, f"{target} does not import: {exc}")
            continue
        register(sub)
    for name, hint in ADD_ON_HINTS.items():
        if name not in added:
            _missing_command(sub, name, hint)
    return parser


def add_on_commands() -> dict[str, str]:
    """Command name -> ``module:register`` of every installed distribution's ``fleetscope.commands``."""
    return {entry.name: entry.value for entry in importlib.metadata.entry_points(group=COMMAND_ENTRY_POINTS)}


def _load_register(target: str) -> Callable[[Any], None]:
    module_name, _, attr = target.partition(":")
    register: Callable[[Any], None] = getattr(importlib.import_module(module_name), attr)
    return register


def _missing_command(sub: Any, name: str, why: str) -> None:
    """A command whose code is not installed: any arguments, one line on stderr, exit 2."""
    # no option prefix: every argument (--nodes 4, --help) is taken as one of the ignored words
    parser = sub.add_parser(name, help="(not installed: run it to see what to install)", add_help=False,
                            prefix_chars="\0")
    parser.add_argument("ignored", nargs="*", help=argparse.SUPPRESS)

    def explain(args: argparse.Namespace) -> int:
        print(f"fleetscope {name}: {why}", file=sys.stderr)
        return 2

    parser.set_defaults(func=explain)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"fleetscope: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
