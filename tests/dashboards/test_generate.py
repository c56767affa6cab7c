"""The committed dashboard JSON is exactly what the code generates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dashboards import require_module

require_module("grafana_foundation_sdk")  # before the generator imports it: fails in CI, skips elsewhere

from fleetscope import dashboards  # noqa: E402
from fleetscope.cli import main  # noqa: E402


def test_committed_json_matches_generator() -> None:
    assert dashboards.stale() == [], "dashboards/ is out of date: run `fleetscope dashboards` and commit"


def test_every_registered_dashboard_is_committed_and_nothing_else() -> None:
    committed = {p.name for p in dashboards.default_directory().glob("*.json")}
    assert committed == {dashboards.file_name(uid) for uid in dashboards.DASHBOARD_MODULES}


def test_generation_is_deterministic(tmp_path: Path) -> None:
    first = {uid: dashboards.render(data) for uid, data in dashboards.build_all().items()}
    second = {uid: dashboards.render(data) for uid, data in dashboards.build_all().items()}
    assert first == second


def test_check_command_flags_an_edited_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", "--output", str(tmp_path)]) == 0
    assert main(["dashboards", "--check", "--output", str(tmp_path)]) == 0

    path = tmp_path / "fleetscope-node.json"
    data = json.loads(path.read_text())
    data["title"] = "edited by hand"
    path.write_text(dashboards.render(data))
    (tmp_path / "fleetscope-efa.json").unlink()

    assert main(["dashboards", "--check", "--output", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "fleetscope-node.json" in err and "fleetscope-efa.json" in err
    assert "fleetscope-fleet.json" not in err


def test_rendered_text_is_stable_json() -> None:
    data = {"b": 1, "a": {"d": [1, 2], "c": "ü"}}
    text = dashboards.render(data)
    assert text.endswith("}\n")
    assert text.index('"a"') < text.index('"b"')
    assert json.loads(text) == data


def test_command_explains_a_missing_sdk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "grafana_foundation_sdk", None)  # makes the import fail
    assert main(["dashboards", "--output", str(tmp_path)]) == 2
    assert "pip install 'fleetscope[dashboards]'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
