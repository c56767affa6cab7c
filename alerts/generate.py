#!/usr/bin/env python3
"""Regenerate the rule files in this directory from exporter/fleetscope/rules/, and the rule counts in the docs.

    python3 alerts/generate.py           write the files
    python3 alerts/generate.py --check   exit 1 if a committed file is out of date

The docs state the rule set's size in marked spans (``<!-- rule-counts -->...<!-- /rule-counts -->``,
docs/deploy.md); they are rewritten here so they never go stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fleetscope.rules.cli import main
from fleetscope.rules.render import doc_counts, with_doc_counts

DOCS = ("docs/deploy.md",)


def docs(repo: Path, check: bool) -> int:
    counts = doc_counts()
    stale = 0
    for name in DOCS:
        path = repo / name
        text = path.read_text(encoding="utf-8")
        updated = with_doc_counts(text, counts)
        if updated == text:
            continue
        if check:
            print(f"{path}: rule counts are out of date; run: python3 alerts/generate.py", file=sys.stderr)
            stale = 1
        else:
            path.write_text(updated, encoding="utf-8")
            print(path)
    return stale


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    check = "--check" in sys.argv[1:]
    status = main(["--check" if check else "--write", str(here)])
    raise SystemExit(max(status, docs(here.parent, check)))
