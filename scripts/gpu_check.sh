#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: the `gpu` tests, then the end-to-end loop (Redis, a rollout
# server, the learner, the demo environment, a few steps) over the weight path the machine has
# (two GPUs: NCCL broadcast; one GPU: CUDA IPC), its log-probability parity check in float32,
# and the bf16 serving gap. Prints a summary to paste into an issue. Every step has a time
# limit: a missing part or a stuck process fails with a message, never a hang.
#
#   scripts/gpu_check.sh                 # from the repository root, its venv active or .venv
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh   # PY, PYTHONPATH
OUT="$(mktemp -d -t gspo-gpu-check-XXXX)"
fail() { echo "gpu_check: FAIL: $*" >&2; exit 1; }

command -v "$PY" >/dev/null || fail "no python ($PY)"
timeout 60 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)" \
  || fail "torch sees no CUDA device (nvidia-smi: $(nvidia-smi -L 2>&1 | head -3))"
command -v redis-server >/dev/null || fail "redis-server not on PATH"
timeout 60 "$PY" -c "import fastapi, uvicorn, redis, transformers, httpx, pytest" \
  || fail "missing Python packages (fastapi, uvicorn, redis, transformers, httpx, pytest)"

# A test module whose imports are missing here (hypothesis, ...) is reported, not fatal.
MARKS="gpu and not vllm"   # vLLM's gpu tests too when vLLM is installed
timeout 60 "$PY" -c "import vllm" >/dev/null 2>&1 && MARKS="gpu"
echo "== gpu tests (-m '$MARKS')"
timeout 1200 "$PY" -m pytest -m "$MARKS" -q -p no:cacheprovider --continue-on-collection-errors tests \
  >"$OUT/pytest.log" 2>&1
TESTS_RC=$?
TESTS_LINE="$(tail -1 "$OUT/pytest.log")"
[ $TESTS_RC -eq 124 ] && TESTS_LINE="TIMED OUT after 1200 s"
echo "$TESTS_LINE"

echo "== end to end, float32 server (parity within 1e-4)"
timeout 900 "$PY" scripts/gpu_check.py --device cuda --dtype float32 --json "$OUT/f32.json" \
  --run-dir "$OUT/f32" >"$OUT/f32.log" 2>&1
F32_RC=$?
echo "== end to end, bfloat16 server (gap printed)"
timeout 900 "$PY" scripts/gpu_check.py --device cuda --dtype bfloat16 --json "$OUT/bf16.json" \
  --run-dir "$OUT/bf16" >"$OUT/bf16.log" 2>&1
BF16_RC=$?

RUNS="f32 bf16"
if timeout 60 "$PY" -c "import vllm" >/dev/null 2>&1; then
  VLLM_RC=0
  for dt in float32 bfloat16; do
    echo "== end to end, vLLM engine, $dt"
    timeout 900 "$PY" scripts/gpu_check.py --device cuda --engine vllm --dtype "$dt" \
      --json "$OUT/vllm-$dt.json" --run-dir "$OUT/vllm-$dt" >"$OUT/vllm-$dt.log" 2>&1 \
      || VLLM_RC=1
    RUNS="$RUNS vllm-$dt"
  done
else
  VLLM_RC=0
  echo "== vLLM not installed: its end-to-end run is skipped"
fi

field() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get(sys.argv[2], '-'))" "$1" "$2" 2>/dev/null || echo "-"; }
echo
# the commit, and whether the tree differs from it (a copied tree may carry a stale .git)
COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo ?)"
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && COMMIT="$COMMIT + local changes"
echo "---- gspo-rl gpu_check ($(date -u +%FT%TZ), commit $COMMIT) ----"
echo "gpus: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | paste -sd';')"
echo "torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
echo "gpu tests: $TESTS_LINE (rc $TESTS_RC)"
for run in $RUNS; do
  if [ -f "$OUT/$run.json" ]; then
    echo "e2e $run: $(field "$OUT/$run.json" result) | path: $(field "$OUT/$run.json" weight_path)" \
         "| server version $(field "$OUT/$run.json" server_policy_version)" \
         "| logprob gap $(field "$OUT/$run.json" logprob_gap)" \
         "| $(field "$OUT/$run.json" seconds) s $(field "$OUT/$run.json" reason | sed 's/^-$//')"
  else
    echo "e2e $run: FAIL (no summary; see $OUT/$run.log: $(tail -1 "$OUT/$run.log"))"
  fi
done
echo "logs: $OUT"
[ "$RUNS" = "f32 bf16" ] && echo "vllm: not installed, not run"
[ $TESTS_RC -eq 0 ] && [ $F32_RC -eq 0 ] && [ $BF16_RC -eq 0 ] && [ $VLLM_RC -eq 0 ]
