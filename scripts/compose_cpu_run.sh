#!/usr/bin/env bash
# A measured run of `docker compose --profile cpu up --build` (BENCHMARKS.md, "Stopping when the
# task is learned"): starts it attached (its output in OUT/up.log), waits until the learner
# exits (the target reward) or, with UNTIL_STEP=N, until the learner's step reaches N; then reads
# the fate of every group from Redis (OUT/redis.txt), keeps the logs and metrics.jsonl, and runs
# `docker compose --profile cpu down -v`. Needs .env (cp .env.example .env, fill in the keys).
#
#   scripts/compose_cpu_run.sh runs/compose                      # until the learner stops
#   GSPO_TARGET_REWARD=0 UNTIL_STEP=67 scripts/compose_cpu_run.sh runs/compose-no-target
#
# On a shared machine wrap it: flock /path/to/bench.lock scripts/compose_cpu_run.sh OUT
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/compose_cpu_run.sh OUT_DIR}
LIMIT_S=${LIMIT_S:-1300}
mkdir -p "$OUT"
LEARNER=$(docker compose --profile cpu ps -a -q learner-cpu 2>/dev/null)
echo "start $(date -u) load $(cat /proc/loadavg) commit $(git rev-parse --short HEAD)" | tee "$OUT/meta.txt"
docker compose --profile cpu up --build > "$OUT/up.log" 2>&1 &
UP=$!
cli() { docker compose --profile cpu exec -T redis redis-cli "$@" 2>/dev/null | tr -d '\r'; }
t0=$(date +%s)
while true; do
  sleep 2
  now=$(date +%s)
  if ! kill -0 "$UP" 2>/dev/null; then echo "docker compose up exited" | tee -a "$OUT/meta.txt"; break; fi
  if [[ -n "${UNTIL_STEP:-}" ]]; then
    step=$(cli HGET gspo-cpu:learner:state step)
    if [[ -n "$step" && "$step" -ge "$UNTIL_STEP" ]]; then
      echo "step $step after $((now - t0)) s" | tee -a "$OUT/meta.txt"; break
    fi
  else
    LEARNER=${LEARNER:-$(docker compose --profile cpu ps -a -q learner-cpu 2>/dev/null)}
    st=$([[ -n "$LEARNER" ]] && docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$LEARNER" 2>/dev/null)
    if [[ "$st" == exited* ]]; then
      echo "learner $st after $((now - t0)) s" | tee -a "$OUT/meta.txt"; break
    fi
  fi
  if (( now - t0 > LIMIT_S )); then echo "gave up after $LIMIT_S s" | tee -a "$OUT/meta.txt"; break; fi
done
[[ -z "${UNTIL_STEP:-}" ]] && sleep 15  # the environment's and the server's log lines
: > "$OUT/redis.txt"
for k in counters learner:state rewards:finished; do
  echo "== gspo-cpu:$k" >> "$OUT/redis.txt"
  cli HGETALL "gspo-cpu:$k" | paste - - >> "$OUT/redis.txt"
done
docker compose --profile cpu logs --no-color > "$OUT/logs.txt" 2>&1
docker compose --profile cpu cp learner-cpu:/checkpoints/metrics.jsonl "$OUT/metrics.jsonl" > /dev/null 2>&1 || true
grep -E "TARGET REWARD|stopped at step" "$OUT/logs.txt" | tee -a "$OUT/meta.txt"
echo "end $(date -u) load $(cat /proc/loadavg)" | tee -a "$OUT/meta.txt"
docker compose --profile cpu down -v > "$OUT/down.log" 2>&1
wait "$UP"
cat "$OUT/redis.txt"
