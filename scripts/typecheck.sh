#!/usr/bin/env bash
# Type-check the whole package with mypy ([tool.mypy] in pyproject.toml: strict on contract/,
# redisq/ and clients/). Exits with mypy's status; tests/checks/test_types.py runs it in CI.
#
#     bash scripts/typecheck.sh [MYPY OPTIONS]   # e.g. --warn-unused-ignores
#
# The folders are installed as one namespace, gspo_rl (setup.py's package_dir), through an
# editable finder hook that mypy cannot follow, so this links them into a temporary tree laid
# out as the installed package (T/gspo_rl/<each entry of gspo/>, T/gspo_rl/{contract,redisq,
# server,learner}, T/gspo_rl/client -> clients) and maps the paths in mypy's report back to the
# repository's. The cache is per machine, not per checkout ($GSPO_CACHE_DIR/mypy, else
# ~/.cache/gspo-rl/mypy): mypy checks each module's source against it, so a second run, or a
# fresh clone's first, rechecks only what changed (~5 s instead of ~65 s here).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
mkdir "$T/gspo_rl"
for entry in gspo/*; do
    [ "$(basename "$entry")" = "__pycache__" ] && continue
    ln -s "$ROOT/$entry" "$T/gspo_rl/$(basename "$entry")"
done
ln -s "$ROOT/contract" "$T/gspo_rl/contract"
ln -s "$ROOT/redisq" "$T/gspo_rl/redisq"
ln -s "$ROOT/server" "$T/gspo_rl/server"
ln -s "$ROOT/learner" "$T/gspo_rl/learner"
ln -s "$ROOT/clients" "$T/gspo_rl/client"
# gspo_rl/<x>/ -> <folder>/, any other gspo_rl/<entry> -> gspo/<entry> (also in notes' texts).
MAP='s#gspo_rl/client/#clients/#g; s#gspo_rl/contract/#contract/#g; s#gspo_rl/redisq/#redisq/#g;'
MAP+=' s#gspo_rl/server/#server/#g; s#gspo_rl/learner/#learner/#g; s#gspo_rl/#gspo/#g'
CACHE="${GSPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gspo-rl}/mypy"
mkdir -p "$CACHE" 2>/dev/null || CACHE="$ROOT/.mypy_cache"
(cd "$T" && MYPYPATH="$T" "$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" \
    --cache-dir "$CACHE" "$@" -p gspo_rl) | sed -E "$MAP"
exit "${PIPESTATUS[0]}"
