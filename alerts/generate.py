#!/usr/bin/env python3
"""Regenerate the rule files in this directory from exporter/fleetscope/rules/.

    python3 alerts/generate.py           write the files
    python3 alerts/generate.py --check   exit 1 if a committed file is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

from fleetscope.rules.cli import main

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    mode = "--check" if "--check" in sys.argv[1:] else "--write"
    raise SystemExit(main([mode, str(here)]))
