#!/usr/bin/env bash
# On a machine with one NVIDIA GPU, within a short lease: the GPU items of the LoRA and
# asynchrony issues, then the `gpu` tests, each step under its own time limit (a stuck step is
# cut, the next one runs), every log under OUT_DIR.
#
#   scripts/gpu_items.sh [OUT_DIR]        # from the repository root
#
# 1. LoRA on an 8B-shaped random model (Qwen3-8B's dimensions, bf16 base): the learner's peak
#    memory, tokens/s and MFU, then the push of the full model and of the adapters alone to a
#    bf16 server on the same GPU (CUDA IPC).
# 2. Asynchronous vs synchronous training with the server and the learner on that one GPU
#    (`bench_async.py --device cuda`: weights over CUDA IPC, each side pinned to half the cores).
# 3. The `gpu`-marked tests (vLLM's excluded when vLLM is not installed).
# Step limits: ASYNC_S, LORA_S, TESTS_S seconds (environment; defaults fit a 10-minute call).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh   # PY, PYTHONPATH, require_cuda
OUT="${1:-$(mktemp -d -t gspo-gpu-items-XXXX)}"
mkdir -p "$OUT"
require_cuda gpu_items
command -v redis-server >/dev/null || { echo "gpu_items: redis-server not on PATH" >&2; exit 1; }
step() {  # name, time limit (s), command...: output to the terminal and OUT/name.log
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date -u +%T), limit $limit s)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "   TIMED OUT after $limit s"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && echo "   exit $rc"
  return 0
}
echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
"$PY" -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers",
    transformers.__version__, "peft", peft.__version__)'
step lora-8b "${LORA_S:-230}" "$PY" benchmarks/bench_lora.py --device cuda --shape 8b \
  --modes lora --rank 8 --groups 8 --group-size 8 --prompt 256 --completion 768 \
  --micro-batch-tokens 16384 --steps 2 --repeats 5
step async "${ASYNC_S:-200}" "$PY" benchmarks/bench_async.py --device cuda --task letters \
  --seeds 0,1,2 --minutes 1.0 --out "$OUT/async.json"
MARKS="gpu and not vllm"
timeout 60 "$PY" -c "import vllm" >/dev/null 2>&1 && MARKS="gpu"
step tests "${TESTS_S:-100}" "$PY" -m pytest -m "$MARKS" -v -p no:cacheprovider \
  --continue-on-collection-errors --timeout 90 -rA tests
echo "logs: $OUT"
