"""fleetscope as a user installs it.

The wheel and sdist are built the way a release is (``python -m build``, ``twine check``), the wheel
goes into a fresh virtual environment without extras, and the commands a user types first run from
there: ``--version``, ``serve --help``, ``check`` on a fixture tree, every module's import, and the
simulator's commands saying what to install. Then the simulator distribution's wheel (``sim/``,
fleetscope-sim) joins it: every one of its modules imports on its own dependencies, and a short
``fleetscope demo --check`` runs until its scheduled alert fires. The README's setup script runs on
the distribution's own (PEP 668 protected) Python when the machine has one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetscope import __version__
from fleetscope.dashboards import DASHBOARD_MODULES
from fleetscope_sim.schedules import SMOKE_SCHEDULE
from tests.conftest import require_binary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "p5"

# The documented optional hooks (pyproject extras) and the extra each one's ImportError must name.
OPTIONAL_HOOKS: dict[str, str] = {
    "fleetscope.client.hf": "hf",
    "fleetscope.client.lightning": "lightning",
    "fleetscope.client.distributed": "torch",  # tracker.watch(model): a model's framework is there already
    "fleetscope.dashboards.nccl_panels": "dashboards",
    "fleetscope.dashboards.kit": "dashboards",
    **dict.fromkeys(DASHBOARD_MODULES.values(), "dashboards"),
}

# Every module of one installed package, imported in a fresh interpreter: module -> None or the error.
IMPORT_PROBE = r"""
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])

outcome = {}
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if info.name.endswith(".__main__"):  # runs the CLI
        continue
    try:
        importlib.import_module(info.name)
        outcome[info.name] = None
    except BaseException as exc:
        outcome[info.name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(outcome))
"""


@dataclass
class Installed:
    bin: Path
    wheel: Path
    sdist: Path
    sim_wheel: Path
    twine_output: str
    seconds: dict[str, float]
    # Seen before the simulator's wheel was installed: the product's modules, and `fleetscope demo`.
    product_imports: dict[str, str | None]
    demo_without_sim: subprocess.CompletedProcess[str]
    sim_imports: dict[str, str | None]

    def run(self, *args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / args[0]), *args[1:]], capture_output=True, text=True,
                              timeout=timeout, check=False, env=clean_environ(), cwd=cwd)


def clean_environ(**extra: str) -> dict[str, str]:
    """This process's environment without what points Python at the checkout or another venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, **extra}


def _run(command: Sequence[str | Path], timeout: float = 600) -> str:
    return _finish(_start(command), timeout)


def _start(command: Sequence[str | Path]) -> subprocess.Popen[str]:
    """``command`` started with its output captured, for :func:`_finish`: independent steps run side by side."""
    return subprocess.Popen([str(c) for c in command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_environ())


def _finish(process: subprocess.Popen[str], timeout: float = 600) -> str:
    """The stdout of a command from :func:`_start`, which must exit 0 within ``timeout`` seconds."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == 0, f"{process.args!r} exited {process.returncode}:\n" \
                                    f"{stdout[-3000:]}\n{stderr[-3000:]}"
    return stdout


def _imports(bin_dir: Path, package: str) -> dict[str, str | None]:
    result = subprocess.run([str(bin_dir / "python"), "-c", IMPORT_PROBE, package], capture_output=True,
                            text=True, timeout=300, check=False, env=clean_environ(), cwd=bin_dir)  # not the checkout
    assert result.returncode == 0, result.stderr
    outcome: dict[str, str | None] = json.loads(result.stdout)
    return outcome


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build wheel + sdist from the checkout, check them, install the wheel (no extras) in a new venv;
    look at it, then add the simulator distribution's wheel (built from sim/) to the same venv.

    What needs the product alone is observed here, before the simulator joins, so no test order matters."""
    base = tmp_path_factory.mktemp("install")
    dist = base / "dist"
    seconds: dict[str, float] = {}
    started = time.monotonic()
    # The two distributions build side by side (each mostly waits on its isolated build environment), the
    # simulator's as the product's: sdist first, the wheel from it (no build/ left in the checkout's sim/).
    # The isolated build environments are made with uv where it is installed (scripts/test installs it): the
    # same wheel and sdist, byte for byte, for about 4 s less CPU per distribution than pip's.
    installer = "uv" if importlib.util.find_spec("uv") or shutil.which("uv") else "pip"
    building = [_start([sys.executable, "-m", "build", "--installer", installer, "--outdir", out, source])
                for out, source in ((dist, ROOT), (base / "sim-dist", ROOT / "sim"))]
    for process in building:
        _finish(process)
    seconds["build"] = time.monotonic() - started
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    (sim_wheel,) = sorted((base / "sim-dist").glob("*.whl"))
    started = time.monotonic()
    venv = base / "venv"
    bin_dir = venv / "bin"
    checking = _start([sys.executable, "-m", "twine", "check", "--strict", wheels[0], sdists[0]])
    _run([sys.executable, "-m", "venv", venv])
    twine = _finish(checking)
    # --no-compile: no bytecode for every dependency up front (what is imported compiles as it loads)
    _run([bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", wheels[0]])
    seconds["venv"] = time.monotonic() - started
    product_imports = _imports(bin_dir, "fleetscope")
    demo_without_sim = subprocess.run([str(bin_dir / "fleetscope"), "demo", "--nodes", "1"], capture_output=True,
                                      text=True, timeout=120, check=False, env=clean_environ(), cwd=bin_dir)
    _run([bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", sim_wheel])
    return Installed(bin_dir, wheels[0], sdists[0], sim_wheel, twine, seconds, product_imports, demo_without_sim,
                     _imports(bin_dir, "fleetscope_sim"))


def test_wheel_and_sdist_pass_twine_check(installed: Installed) -> None:
    assert installed.wheel.name == f"fleetscope-{__version__}-py3-none-any.whl"
    assert installed.twine_output.count("PASSED") == 2, installed.twine_output


def test_the_license_ships_in_the_wheel_and_the_sdist(installed: Installed) -> None:
    """Apache-2.0, the full text, as the repository carries it: in the wheel's dist-info and the sdist's root."""
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    with zipfile.ZipFile(installed.wheel) as wheel:
        assert wheel.read(f"fleetscope-{__version__}.dist-info/licenses/LICENSE").decode() == text
        metadata = wheel.read(f"fleetscope-{__version__}.dist-info/METADATA").decode().splitlines()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    with tarfile.open(installed.sdist) as sdist:
        member = sdist.extractfile(f"fleetscope-{__version__}/LICENSE")
        assert member is not None and member.read().decode() == text


def test_no_extra_is_installed(installed: Installed) -> None:
    listed = installed.run("python", "-m", "pip", "list", "--format=json", "--disable-pip-version-check")
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "fleetscope" in names
    assert not names & {"requests", "torch", "transformers", "lightning", "grafana-foundation-sdk",
                        "pytest"}, names


def test_version_and_serve_help(installed: Installed) -> None:
    version = installed.run("fleetscope", "--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"fleetscope {__version__}")
    serve = installed.run("fleetscope", "serve", "--help")
    assert serve.returncode == 0, serve.stderr
    assert "--web.listen-address" in serve.stdout and "--path.sysfs" in serve.stdout


def test_check_gives_a_verdict_on_a_fixture_tree(installed: Installed) -> None:
    paths = ("--path.sysfs", str(FIXTURE / "sys"), "--path.procfs", str(FIXTURE / "proc"), "--no-collector.gpu")
    healthy = installed.run("fleetscope", "check", *paths, "--efa.expected-count", "32")
    assert (healthy.returncode, healthy.stdout.strip().splitlines()[-1]) == (0, "HEALTHY"), healthy.stderr
    # One EFA device short of what the node should have: unhealthy, and the finding says why.
    short = installed.run("fleetscope", "check", *paths, "--efa.expected-count", "33")
    assert short.returncode == 1, short.stdout + short.stderr
    assert "32" in short.stdout and "33" in short.stdout


def test_every_module_imports_without_extras(installed: Installed) -> None:
    outcome = installed.product_imports
    assert len(outcome) > 50 and set(OPTIONAL_HOOKS) <= set(outcome)
    failed = {name: error for name, error in outcome.items() if error and name not in OPTIONAL_HOOKS}
    assert failed == {}
    for module, extra in OPTIONAL_HOOKS.items():
        error = outcome[module]
        assert error is not None and error.startswith(("ImportError", "ModuleNotFoundError")), (module, error)
        assert f"pip install 'fleetscope[{extra}]'" in error, (module, error)


DASHBOARDS_PROBE = r"""
import json
from fleetscope import dashboards

loaded = dashboards.load()
print(json.dumps({"directory": str(dashboards.default_directory()), "dashboards": loaded,
                  "queries": [q.expr for q in dashboards.queries(loaded)]}))
"""


def test_dashboards_load_from_the_installed_wheel(installed: Installed) -> None:
    """The fleet benchmark reads the panel queries from an installed fleetscope: the JSON ships as package data."""
    from fleetscope import dashboards

    probe = installed.run("python", "-c", DASHBOARDS_PROBE, cwd=installed.bin)  # not from the checkout
    assert probe.returncode == 0, probe.stderr[-3000:]
    shipped = json.loads(probe.stdout)
    assert "site-packages" in shipped["directory"], shipped["directory"]
    assert shipped["dashboards"] == dashboards.load()  # the committed files, byte for byte in content
    assert shipped["queries"] == [q.expr for q in dashboards.queries()] and len(shipped["queries"]) > 50


def test_the_product_wheel_carries_no_simulator(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert any(name.startswith("fleetscope/sources/") for name in names)
    assert not [name for name in names if name.startswith(("fleetscope/sim/", "fleetscope/nvml_fake/",
                                                           "fleetscope_sim/"))]
    assert not [name for name in names if name.endswith(".yaml") and "scenarios" in name]
    sim_names = zipfile.ZipFile(installed.sim_wheel).namelist()
    assert "fleetscope_sim/nvml_fake/scenarios/h100_8x_healthy.yaml" in sim_names
    assert not [name for name in sim_names if name.startswith("fleetscope/")]  # the product stays the product's


def test_the_simulator_is_released_with_the_product(installed: Installed) -> None:
    with zipfile.ZipFile(installed.sim_wheel) as wheel:
        metadata = wheel.read(f"fleetscope_sim-{__version__}.dist-info/METADATA").decode()
        entry_points = wheel.read(f"fleetscope_sim-{__version__}.dist-info/entry_points.txt").decode()
    assert f"Requires-Dist: fleetscope=={__version__}" in metadata.splitlines()
    assert "[fleetscope.commands]" in entry_points and "demo = fleetscope_sim.cli:register_demo" in entry_points


def test_without_the_simulator_its_commands_say_what_to_install(installed: Installed) -> None:
    demo = installed.demo_without_sim
    assert demo.returncode == 2 and demo.stdout == "", demo
    assert demo.stderr.count("\n") == 1 and "fleetscope-sim" in demo.stderr and "pip install ./sim" in demo.stderr


def test_every_simulator_module_imports_on_its_dependencies(installed: Installed) -> None:
    outcome = installed.sim_imports
    assert {"fleetscope_sim.nvml_fake", "fleetscope_sim.kernel_tree", "fleetscope_sim.replay",
            "fleetscope_sim.cli"} <= set(outcome)
    assert {name: error for name, error in outcome.items() if error} == {}


def test_demo_runs_until_its_scheduled_alert_fires(installed: Installed, tmp_path: Path) -> None:
    """The built-in smoke schedule's Xid 48 (t+15 s), from a schedule file at t+1 s: the same fault and alert,
    sooner (the alert's rule fires on a counter's new series as on its increase)."""
    require_binary("prometheus")
    smoke = tmp_path / "smoke.yaml"
    (fault,) = SMOKE_SCHEDULE["faults"]
    smoke.write_text(json.dumps({"faults": [{**fault, "at": "1s"}]}))  # JSON is YAML
    started = time.monotonic()
    demo = installed.run("fleetscope", "demo", "--nodes", "1", "--jobs", "1", "--faults", str(smoke), "--check",
                         "--no-alertmanager", "--no-grafana", "--base-port", "0",
                         "--prometheus-port", "0", timeout=300, cwd=installed.bin)
    installed.seconds["demo"] = time.monotonic() - started
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert re.search(r"FAULT +\[1/1\] xid  node-00 gpu 1 \(job-a rank 1\) xid 48", demo.stdout), demo.stdout
    assert re.search(r"FIRING +GpuXidResetRequired \(critical\)  node-00 gpu 1 xid 48 — detected \d+ s after xid",
                     demo.stdout)
    assert "1 of 1 faults detected with the right labels" in demo.stdout
    print(f"install check: {installed.seconds}")  # shown with -s; the figures docs/demo.md quotes


def test_readme_demo_script_sets_up_on_the_distributions_python(tmp_path: Path) -> None:
    """scripts/demo on Debian's own python3 (PEP 668: it refuses a bare pip install) makes its venv."""
    debian = Path("/usr/bin/python3")
    protected = debian.exists() and any(Path("/usr/lib").glob("python3*/EXTERNALLY-MANAGED"))
    python = str(debian) if protected else sys.executable
    # PIP_COMPILE=0 (pip's --no-compile): no bytecode for every dependency up front; the script is unchanged
    env = clean_environ(PYTHON=python, VENV=str(tmp_path / "venv"), PIP_COMPILE="0")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "demo"), "--help"], capture_output=True, text=True,
                            timeout=600, check=False, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "usage: fleetscope demo" in result.stdout
    assert (tmp_path / "venv" / "bin" / "fleetscope").exists()


def test_readme_gives_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "\nbash scripts/demo\n" in readme and "\nbash scripts/test\n" in readme


def test_setup_scripts_pass_shellcheck() -> None:
    shellcheck = require_binary("shellcheck")
    scripts = [ROOT / "scripts" / name for name in ("demo", "test", "lib.sh", "image", "lock")] + [ROOT / ".ci" / "run"]
    result = subprocess.run([shellcheck, "-x", "--severity=style", *map(str, scripts)], capture_output=True,
                            text=True, timeout=120, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout

