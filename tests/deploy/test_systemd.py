"""The systemd unit, its install script, the shipped configs and shellcheck over every deploy script."""

from __future__ import annotations

import configparser
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fleetscope.config import Config, load
from fleetscope.serve.listeners import ListenerLimits, fit_to_open_files
from tests.conftest import require_binary
from tests.deploy.manifests import REPO

SYSTEMD = REPO / "deploy" / "systemd"
UNIT = SYSTEMD / "fleetscope.service"
SCRIPTS = sorted((REPO / "deploy").rglob("*.sh"))


def unit_settings() -> dict[str, list[str]]:
    """Every Key=value of the [Service] section, repeated keys kept in order."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        if section == "Service":
            settings.setdefault(key, []).append(value)
    return settings


def test_every_deploy_script_passes_shellcheck() -> None:
    shellcheck = require_binary("shellcheck")
    assert len(SCRIPTS) >= 5
    result = subprocess.run([shellcheck, "--severity=style", *map(str, SCRIPTS)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = require_binary("systemd-analyze")
    fleetscope = shutil.which("fleetscope") or pytest.fail("the fleetscope entry point is not installed")
    # verify insists that ExecStart exists; point it at this machine's entry point.
    unit = tmp_path / "fleetscope.service"
    unit.write_text(UNIT.read_text().replace("/opt/fleetscope/venv/bin/fleetscope", fleetscope))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False)
    # Unknown keys and bad values are only warnings (exit 0): any output is a failure.
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def test_hardening_keeps_nvml_proc_and_kmsg_reachable() -> None:
    settings = unit_settings()
    assert settings["User"] == ["root"]
    assert settings["NoNewPrivileges"] == ["yes"] and settings["ProtectSystem"] == ["strict"]
    # These would hide /dev/nvidia*, other users' /proc/<pid>, /proc/net or /dev/kmsg.
    for key in ("PrivateDevices", "ProtectClock", "ProtectKernelLogs", "ProtectProc", "ProcSubset", "DynamicUser",
                "PrivateUsers", "PrivateNetwork"):
        assert key not in settings, f"{key} breaks the daemon"
    allowed = settings["DeviceAllow"]
    assert "char-nvidia* rw" in allowed and "/dev/kmsg r" in allowed
    capabilities = settings["CapabilityBoundingSet"][0].split()
    assert {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"} <= set(capabilities), "needed for other users' /proc/<pid>/environ"
    assert "CAP_SYS_ADMIN" not in capabilities


def test_unit_starts_the_daemon_with_the_installed_config() -> None:
    (exec_start,) = unit_settings()["ExecStart"]
    argv = exec_start.split()
    assert argv[1] == "serve" and "--config=/etc/fleetscope/config.yaml" in argv


@pytest.mark.parametrize("path", [SYSTEMD / "config.yaml", REPO / "deploy" / "kubernetes" / "base" / "config.yaml"])
def test_shipped_daemon_configs_are_accepted(path: Path) -> None:
    config = load(environ={}, yaml_path=str(path))
    assert config.web.listen_address.endswith(":9402")


def test_the_slurm_push_listener_is_loopback_only() -> None:
    """On Slurm the ranks are local: nothing on the network may push (#35)."""
    config = load(environ={}, yaml_path=str(SYSTEMD / "config.yaml"))
    assert config.push.listen_address.startswith("127.0.0.1:")
    assert config.push.listen_address != config.web.listen_address


def test_tmpfiles_recreates_the_jobs_dir_the_daemon_reads() -> None:
    lines = [line.split() for line in (SYSTEMD / "fleetscope.tmpfiles.conf").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert ["d", load(environ={}).gpu.jobs_dir, "0755", "root", "root", "-"] in lines


def test_tmpfiles_makes_the_nccl_inspector_dir_writable_for_jobs() -> None:
    lines = [line.split() for line in (SYSTEMD / "fleetscope.tmpfiles.conf").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert ["d", load(environ={}).nccl.dir, "1777", "root", "root", "7d"] in lines


@pytest.mark.slow
def test_install_script_lays_out_a_working_tree(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # The venv install.sh installs into, made here so it needs no downloads: it sees this interpreter's
    # packages through a .pth file (install.sh keeps a venv that exists). `venv --system-site-packages`
    # does not do that from inside a virtual environment: it sees the base interpreter's packages only.
    venv = root / "opt" / "fleetscope" / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", where],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(purelib, "test-packages.pth").write_text(
        "\n".join(p for p in sys.path if p.endswith("-packages") and Path(p).is_dir()) + "\n")
    env = {**os.environ, "PIP_ARGS": "--no-deps"}
    env.pop("PYTHONPATH", None)  # the installed fleetscope must be the one that answers

    def run(*package: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(SYSTEMD / "install.sh"), "--root", str(root), "--no-start", *package],
                              env=env, capture_output=True, text=True, timeout=300, check=False)

    result = run()  # the checkout, built and installed
    assert result.returncode == 0, result.stderr
    assert Path(purelib, "fleetscope", "__init__.py").is_file()  # in the venv, not seen through the .pth
    # The runs after it are about the config: pip is asked for the fleetscope it has (no index, no build), where
    # another build of the checkout would cost as much as the first.
    env["PIP_ARGS"] = "--no-deps --no-index"
    again = ("--package", "fleetscope")
    # The config may hold the push token: root only (it was installed 0644, #30 item 6).
    config = root / "etc" / "fleetscope" / "config.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    config.write_text("push:\n  token: s3cret\n")
    config.chmod(0o644)
    kept = run(*again)
    assert kept.returncode == 0 and stat.S_IMODE(config.stat().st_mode) == 0o600, kept.stderr
    binary = root / "opt" / "fleetscope" / "venv" / "bin" / "fleetscope"
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert version.returncode == 0 and version.stdout.startswith("fleetscope ")
    assert (root / "etc" / "systemd" / "system" / "fleetscope.service").read_text() == UNIT.read_text()
    for script in ("healthcheck.sh", "prolog.sh", "epilog.sh", "task-prolog.sh"):
        assert os.access(root / "opt" / "fleetscope" / "slurm" / script, os.X_OK)
    # A second run keeps the operator's config, and refuses one the daemon would reject before touching systemd.
    config.write_text("gpu:\n  expected-cuont: 8\n")
    refused = run(*again)
    assert refused.returncode == 1 and "not accepted" in refused.stderr
    assert config.read_text() == "gpu:\n  expected-cuont: 8\n"


def test_unit_file_is_plain_ini() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    assert parser["Install"]["WantedBy"] == "multi-user.target"


def test_open_files_limit_leaves_both_listeners_their_default_connection_cap() -> None:
    """systemd's soft default (1024) would lower web.max-connections; the unit raises it."""
    (limit,) = unit_settings()["LimitNOFILE"]
    web = Config().web
    fitted = fit_to_open_files(ListenerLimits(web.max_connections, web.read_header_timeout, web.read_timeout),
                               2, int(limit))
    assert fitted.max_connections == web.max_connections
