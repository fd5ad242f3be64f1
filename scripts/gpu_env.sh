# Sourced from the repository root by the GPU scripts (gpu_check.sh, gpu_learner_bench.sh,
# gpu_items.sh): sets PY ($PYTHON, else .venv's, else python3) with this checkout importable
# as the gspo_rl namespace (setup.py maps its folders; installed editable, without
# dependencies, when that Python does not have it: a lent GPU machine brings its own torch),
# and exports PYTHONPATH and PYTHONUNBUFFERED. `require_cuda NAME` exits unless torch sees a
# CUDA device.
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
"$PY" -c "import gspo_rl.server" 2>/dev/null \
  || "$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null \
  || { echo "$(basename "$0"): cannot install this checkout into $PY" >&2; exit 1; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

require_cuda() {
  timeout 60 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)" \
    || { echo "$1: torch sees no CUDA device" >&2; exit 1; }
}
