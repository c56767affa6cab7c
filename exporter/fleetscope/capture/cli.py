"""``fleetscope capture``: a redacted, replayable snapshot of this node for a bug report."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any


def cmd_capture(args: argparse.Namespace) -> int:
    from fleetscope.capture.archive import CaptureError, render, take_snapshot, write_archive, write_mapping
    from fleetscope.cli import config_from_args
    from fleetscope.logs import setup_logging

    config = config_from_args(args)
    setup_logging(config.log, quiet=True)
    snapshot = take_snapshot(config, nvml=args.nvml, nvml_timeout=args.nvml_timeout,
                             gpm_interval=args.gpm_interval, event_wait=args.event_wait)
    output = args.output or time.strftime("fleetscope-capture-%Y%m%dT%H%M%SZ.tar.gz", time.gmtime(snapshot.created))
    try:
        rendered = render(snapshot)
        write_archive(rendered, output, snapshot.created)
        if args.mapping:
            write_mapping(rendered, args.mapping)
    except CaptureError as exc:
        print(f"fleetscope capture: {exc}", file=sys.stderr)
        return 1
    contents = rendered.manifest["contents"]
    print(f"wrote {output} ({os.path.getsize(output) / 1024:.0f} KiB)")
    print(f"  sys: {contents['sys']['files']} files, {len(contents['sys']['refused'])} refused by the kernel")
    print(f"  kmsg: {contents['kmsg']['records_kept']} of {contents['kmsg']['records_read']} records kept"
          + (f" ({contents['kmsg']['error']})" if contents["kmsg"]["error"] else ""))
    for part, counted, noun in (("nvml", "gpus", "GPUs"), ("ena", "interfaces", "interfaces")):
        error = contents[part]["error"]
        print(f"  {part}: {contents[part][counted]} {noun}" + (f" ({error})" if error else ""))
    replaced = ", ".join(f"{n} {kind}" for kind, n in rendered.manifest["redaction"]["replaced"].items()) or "nothing"
    print(f"  redacted: {replaced}" + (f"; table in {args.mapping} (keep it to yourself)" if args.mapping else ""))
    for problem in rendered.manifest["problems"]:
        print(f"  problem: {problem}")
    print(f"replay: fleetscope simulate-node --from {output} --listen 127.0.0.1:9402")
    return 0


def register(sub: Any) -> None:
    from fleetscope.cli import add_setting_flags

    parser = sub.add_parser("capture", help="Write a redacted, replayable snapshot of this node (for a bug report).",
                            description=__doc__)
    add_setting_flags(parser)
    parser.add_argument("-o", "--output", default=None,
                        help="Archive to write (default: fleetscope-capture-<UTC time>.tar.gz here).")
    parser.add_argument("--mapping", metavar="FILE", default=None,
                        help="Also write pseudonym -> original here (mode 0600; never attach it).")
    parser.add_argument("--no-nvml", dest="nvml", action="store_false", help="Do not query NVML.")
    parser.add_argument("--nvml-timeout", type=float, default=5.0, help="Seconds one NVML call may take (default 5).")
    parser.add_argument("--gpm-interval", type=float, default=1.0,
                        help="Seconds between the two GPM samples (default 1).")
    parser.add_argument("--event-wait", type=float, default=0.5,
                        help="Seconds to listen for NVML error events (default 0.5).")
    parser.set_defaults(func=cmd_capture)
