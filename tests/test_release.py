"""Release hygiene: one version everywhere it is written, and the files a release needs.

The version's single source is ``fleetscope.__version__``; the build reads it from there (pyproject's
``dynamic = ["version"]``), and every other place that names a version must agree with it: the simulator
distribution and its pin, the kustomize base's image tag, the Helm chart's ``appVersion``, ``fleetscope_build_info``
and the changelog's section; the image's label and ``fleetscope --version`` in it are checked where it is built
(tests/deploy/test_image.py).
"""

from __future__ import annotations

import platform
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from fleetscope import __version__
from fleetscope.serve.engine import Engine
from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZATIONS = [ROOT / "deploy/kubernetes/base/kustomization.yaml",
                  ROOT / "deploy/kubernetes/components/node-problem-detector/kustomization.yaml"]
IMAGE = "localhost/fleetscope"  # what scripts/image builds


def _toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def test_the_version_is_written_once() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    product = _toml(ROOT / "pyproject.toml")
    assert "version" not in product["project"] and product["project"]["dynamic"] == ["version"]
    assert product["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fleetscope.__version__"}
    # The simulator is released with the product, pinned to it.
    sim = _toml(ROOT / "sim" / "pyproject.toml")["project"]
    assert sim["version"] == __version__ and f"fleetscope=={__version__}" in sim["dependencies"]


def test_the_kustomize_image_is_the_one_scripts_image_builds_for_this_version() -> None:
    for path in KUSTOMIZATIONS:
        images = yaml.safe_load(path.read_text())["images"]
        assert images == [{"name": "fleetscope", "newName": IMAGE, "newTag": __version__}], path


def test_build_info_carries_the_version() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Engine([]))
    labels = {"version": __version__, "python": platform.python_version()}
    assert registry.get_sample_value("fleetscope_build_info", labels) == 1


def test_the_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((ROOT / "deploy/helm/fleetscope/Chart.yaml").read_text())
    assert chart["appVersion"] == __version__ and chart["version"] == __version__, chart


def test_the_changelog_has_a_section_for_this_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^]]+)\] - (\S+)$", changelog, re.MULTILINE)
    assert headings and headings[0][0] == __version__, headings  # newest first
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}|Unreleased", date) for _, date in headings), headings
    assert re.search(r"^### (Added|Changed|Deprecated|Removed|Fixed|Security)$", changelog, re.MULTILINE)


def test_the_release_files_are_there() -> None:
    assert (ROOT / "LICENSE").read_text().count("Apache License") >= 1
    security = (ROOT / "SECURITY.md").read_text()
    assert "## Reporting a vulnerability" in security and "## Supported versions" in security
    stability = (ROOT / "docs" / "stability.md").read_text()
    assert "## Deprecation" in stability


def test_the_release_workflow_passes_actionlint_and_builds_every_artifact() -> None:
    """Offline: actionlint (with shellcheck over the run steps where it is installed), then what it must do."""
    path = ROOT / ".github" / "workflows" / "release.yml"
    result = subprocess.run([require_binary("actionlint"), "-oneline", str(path)], capture_output=True, text=True,
                            timeout=60, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    workflow = yaml.safe_load(path.read_text())
    assert workflow[True]["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+"]  # YAML 1.1 reads the key `on` as True
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    runs = "\n".join(step.get("run", "") for step in steps)
    assert "python -m build --outdir dist ." in runs and "twine check --strict" in runs
    assert "helm package deploy/helm/fleetscope" in runs and "cyclonedx-py environment" in runs
    (image,) = [step for step in steps if step.get("uses", "").startswith("docker/build-push-action@")]
    assert image["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert image["with"]["file"] == "deploy/container/Dockerfile" and image["with"]["push"] is True
    assert "exporter/fleetscope/__init__.py" in runs and "CHANGELOG.md" in runs  # the tag is the version
