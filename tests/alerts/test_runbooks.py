"""Every alert links to a runbook entry that says what it means, how to confirm it, what to do."""

from __future__ import annotations

import re
from typing import Any

from fleetscope.rules.settings import RUNBOOK_BASE_URL

from .rulefiles import REPO

RUNBOOKS = REPO / "docs" / "runbooks.md"
SECTION = re.compile(r"^## (\S+)\s*$", re.MULTILINE)
PARTS = ("**Meaning.**", "**Confirm.**", "**Action.**")


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_sections() -> dict[str, str]:
    """anchor -> section text, for single-word (alert name) headings."""
    text = RUNBOOKS.read_text(encoding="utf-8")
    matches = list(SECTION.finditer(text))
    out = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        out[github_anchor(match.group(1))] = text[match.end():end]
    return out


def test_every_alert_has_a_complete_runbook_entry(production_alerts: list[dict[str, Any]]) -> None:
    sections = runbook_sections()
    for rule in production_alerts:
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == RUNBOOK_BASE_URL and path.endswith("/docs/runbooks.md"), url
        assert anchor == github_anchor(rule["alert"]), url
        assert anchor in sections, f"no runbook entry for {rule['alert']}"
        for part in PARTS:
            assert part in sections[anchor], f"runbook entry {rule['alert']} lacks {part}"


def test_every_runbook_entry_belongs_to_an_alert(production_alerts: list[dict[str, Any]]) -> None:
    alert_anchors = {github_anchor(rule["alert"]) for rule in production_alerts}
    entries = {anchor for anchor, body in runbook_sections().items() if "**Meaning.**" in body}
    assert entries == alert_anchors


def test_every_alert_names_its_labels(production_alerts: list[dict[str, Any]]) -> None:
    for rule in production_alerts:
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"].endswith(".")
        assert "$labels." in rule["annotations"]["description"], rule["alert"]
