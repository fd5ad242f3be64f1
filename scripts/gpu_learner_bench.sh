#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the learner's GPU tests and every learner benchmark of
# issue 16, in one command (each step under a time limit; the logs go to one folder).
#
#   scripts/gpu_learner_bench.sh [OUT_DIR]     # from the repository root
#
# Steps: the gpu-marked learner tests; bench_learner.py --suite (0.5B/16384, 1.5B/32768,
# 0.5B/65536, ours then the naive baseline); the log-prob head alone; the losses on CUDA;
# one profiled 0.5B step. Ends with the lines to paste into BENCHMARKS.md.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh   # PY, PYTHONPATH, require_cuda
OUT="${1:-$(mktemp -d -t gspo-gpu-learner-XXXX)}"
mkdir -p "$OUT"
require_cuda gpu_learner_bench
step() {  # name, time limit (s), command...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "   TIMED OUT after $limit s"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "   exit $rc (see $OUT/$name.log)"
  return 0
}
step tests 600 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/learner
step suite 900 "$PY" benchmarks/bench_learner.py --suite
step head 300 "$PY" benchmarks/bench_learner.py --head --tokens 8192 --vocab 151936 --steps 5
step losses 300 "$PY" benchmarks/bench_losses.py --device cuda
step profile 600 "$PY" benchmarks/profile_learner.py --rows 30
echo
echo "---- gspo-rl learner on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?) ----"
tail -1 "$OUT/tests.log"
grep -E "^[0-9.]+b:|^ours|^baseline|ratio" "$OUT/suite.log"
grep -E "^fused|^plain|ratio" "$OUT/head.log"
grep -E "^cuda" "$OUT/losses.log"
grep -A8 "by category" "$OUT/profile.log"
echo "logs: $OUT"
