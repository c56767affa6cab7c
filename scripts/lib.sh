# shellcheck shell=bash
# Shared by scripts/demo and scripts/test (sourced, not run): the OS packages and the virtual
# environment, the same on a fresh Debian/Ubuntu machine as root (no sudo there) or as a user with sudo.
# Debian's and Ubuntu's python3 refuse a bare `pip install` (PEP 668), so Python packages go into a
# virtual environment: $VENV, default .venv in the checkout.

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
JUST_INSTALLED=()  # the OS packages this run installed

require_python() {
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        echo "fleetscope needs Python >= 3.11: install python3 (Debian 12, Ubuntu 24.04 or later)" >&2
        exit 1
    fi
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "fleetscope needs Python >= 3.11; $PYTHON is $("$PYTHON" -c 'import platform; print(platform.python_version())')" \
             "(set PYTHON=/path/to/python3.11 or newer)" >&2
        exit 1
    fi
}

# install_os_packages PKG...: the ones not installed yet, with apt-get.
install_os_packages() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing OS packages: ${missing[*]}" >&2
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        JUST_INSTALLED+=("${missing[@]}")
    fi
}

# stop_services NAME...: Debian starts a server's service on install; fleetscope runs its own instances.
stop_services() {
    local svc
    for svc in "$@"; do
        $SUDO systemctl stop "$svc" >/dev/null 2>&1 || $SUDO service "$svc" stop >/dev/null 2>&1 || true
    done
}

# The virtual environment (made once, reused); its pip is the one to install with.
make_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    VENV="$(cd "$VENV" && pwd)"
    # Bytecode is compiled when a module is first imported, not at install (see venv_install), and must be
    # kept: with PYTHONDONTWRITEBYTECODE set (some machines' images set it), every process the tests or the
    # demo start (daemons, ranks, simulators) compiled torch, FastAPI and the rest again, a fresh clone's
    # test run a third slower.
    unset PYTHONDONTWRITEBYTECODE
    export PATH="$VENV/bin:$PATH"
    export VIRTUAL_ENV="$VENV"
}

venv_pip() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
}

# venv_install ARGS...: what pip would install, with uv (pinned, installed into the venv by pip): it fetches
# in parallel and compiles no bytecode up front, which took a fresh clone's install of the test extras from
# 6 minutes to under one on a 2-core machine (same versions resolved; scripts/lock pins the same uv). Where
# uv cannot be installed, pip does it.
venv_install() {
    if [ -x "$VENV/bin/uv" ] || venv_pip --no-compile "uv==0.13.9" 2>/dev/null; then
        # uv reads no pip configuration: the wheel directories pip is told of (PIP_FIND_LINKS or a pip.conf's
        # find-links, where a machine keeps its CPU build of torch) are passed on.
        local links=() link
        while read -r link; do
            links+=(--find-links "$link")
        done < <("$VENV/bin/python" -m pip config list 2>/dev/null \
                 | sed -n "s/^[^=]*\.find-links='\(.*\)'$/\1/p" | tr ' ' '\n' | sed '/^$/d' | sort -u)
        "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" "${links[@]}" "$@"
    else
        venv_pip "$@"
    fi
}
