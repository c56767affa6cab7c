#!/bin/bash
# Install fleetscope as a systemd service on a GPU node (Slurm, ParallelCluster,
# HyperPod or any bare-metal host):
#
#   sudo deploy/systemd/install.sh [--package SPEC] [--root DIR] [--no-start]
#
#   --package SPEC  what pip installs into the venv (default: this checkout)
#   --root DIR      install below DIR instead of / (image builds, tests)
#   --no-start      do not enable or start the service
#
# Lays out:
#   /opt/fleetscope/venv              the daemon and its Python dependencies
#   /opt/fleetscope/slurm/*.sh        HealthCheckProgram, Prolog, Epilog, TaskProlog
#   /etc/fleetscope/config.yaml       settings, mode 0600 (kept if it already exists, made 0600)
#   /etc/systemd/system/fleetscope.service
#   /etc/tmpfiles.d/fleetscope.conf   recreates /run/fleetscope/jobs at boot
#
# Environment: PYTHON (default python3), VENV_ARGS and PIP_ARGS (extra
# arguments for `python -m venv` and `pip install`).

set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
checkout="$(cd "$here/../.." && pwd)"
package="$checkout"
root=""
start=true

while [ $# -gt 0 ]; do
    case "$1" in
        --package) package="$2"; shift 2 ;;
        --root) root="${2%/}"; shift 2 ;;
        --no-start) start=false; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

python="${PYTHON:-python3}"
prefix="$root/opt/fleetscope"
venv="$prefix/venv"

echo "installing fleetscope into $venv"
install -d -m 0755 "$prefix" "$root/etc/fleetscope" "$root/etc/systemd/system" "$root/etc/tmpfiles.d" "$prefix/slurm"
if [ ! -x "$venv/bin/python" ]; then
    # shellcheck disable=SC2086 # VENV_ARGS is a list of arguments
    "$python" -m venv ${VENV_ARGS:-} "$venv"
fi
# shellcheck disable=SC2086 # PIP_ARGS is a list of arguments
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check ${PIP_ARGS:-} "$package"

install -m 0644 "$here/fleetscope.service" "$root/etc/systemd/system/fleetscope.service"
install -m 0644 "$here/fleetscope.tmpfiles.conf" "$root/etc/tmpfiles.d/fleetscope.conf"
# The config may hold push.token: readable by root only (the daemon runs as root).
if [ -e "$root/etc/fleetscope/config.yaml" ]; then
    echo "keeping existing $root/etc/fleetscope/config.yaml (mode 0600)"
    chmod go-rwx "$root/etc/fleetscope/config.yaml"
else
    install -m 0600 "$here/config.yaml" "$root/etc/fleetscope/config.yaml"
fi
for script in healthcheck.sh prolog.sh epilog.sh task-prolog.sh; do
    install -m 0755 "$checkout/deploy/slurm/$script" "$prefix/slurm/$script"
done

# Fail before touching systemd if the installed daemon rejects the config.
if ! "$venv/bin/python" -c 'import sys; from fleetscope.config import load; load(environ={}, yaml_path=sys.argv[1])' \
    "$root/etc/fleetscope/config.yaml"; then
    echo "install.sh: $root/etc/fleetscope/config.yaml is not accepted by the installed fleetscope" >&2
    exit 1
fi

if $start && [ -z "$root" ]; then
    systemd-tmpfiles --create /etc/tmpfiles.d/fleetscope.conf
    systemctl daemon-reload
    systemctl enable --now fleetscope.service
    echo "fleetscope is running: systemctl status fleetscope; curl -s localhost:9402/metrics | head"
else
    echo "installed below ${root:-/}; not started"
fi
