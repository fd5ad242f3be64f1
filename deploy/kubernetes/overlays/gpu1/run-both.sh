#!/usr/bin/env bash
# overlays/gpu1: the rollout server and the learner in ONE container, on its one GPU.
#
#   run-both.sh SERVER COMMAND... --then LEARNER COMMAND...
#
# Why one container: the server gets the learner's weights as CUDA IPC handles, which needs
# both processes on the same physical GPU and in one IPC namespace (compose's gpu1 profile:
# two containers with `ipc: host`). Kubernetes' device plugin gives a GPU to one container
# only, so two containers (or pods) cannot share it without time-slicing, MPS or DRA; in one
# container they share the GPU and the pod's IPC namespace as they do under `gspo up`.
#
# What it does (compose's depends_on and restart, in a container):
#   1. starts the server, waits until its /health answers 200 ($HEALTH_URL, polled every
#      $HEALTH_POLL_S seconds, default 5);
#   2. starts the learner;
#   3. when either exits, stops the other (SIGTERM, graceful) and exits with the first one's
#      status, so the kubelet restarts the pair (the learner resumes from its checkpoint, the
#      server gets the weights again);
#   4. on SIGTERM (pod deletion) passes it to both and waits for them: the learner checkpoints,
#      the server finishes its requests.
set -uo pipefail

first=()
second=()
seen_then=0
for arg in "$@"; do
    if [[ $seen_then == 0 && $arg == "--then" ]]; then
        seen_then=1
    elif [[ $seen_then == 0 ]]; then
        first+=("$arg")
    else
        second+=("$arg")
    fi
done
if [[ ${#first[@]} == 0 || ${#second[@]} == 0 ]]; then
    echo "usage: run-both.sh SERVER COMMAND... --then LEARNER COMMAND..." >&2
    exit 2
fi

pids=()
stopping=0
# Once: a second SIGTERM makes uvicorn and the learner abort instead of stopping gracefully.
stop() {
    [[ $stopping == 1 ]] && return
    stopping=1
    ((${#pids[@]})) && kill -TERM "${pids[@]}" 2>/dev/null
}
# Waits for every child, also when a signal interrupts `wait`.
wait_all() {
    local pid
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null; do
            wait "$pid"
        done
    done
}
trap stop TERM INT

"${first[@]}" &
pids+=("$!")
echo "run-both: started ${first[*]:0:2} (pid ${pids[0]}); waiting for ${HEALTH_URL}"
until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
        "$HEALTH_URL" 2>/dev/null; do
    if [[ $stopping == 1 ]] || ! kill -0 "${pids[0]}" 2>/dev/null; then
        stop
        wait "${pids[0]}"
        status=$?
        wait_all
        exit "$status"
    fi
    sleep "${HEALTH_POLL_S:-5}"
done

"${second[@]}" &
pids+=("$!")
echo "run-both: started ${second[*]:0:2} (pid ${pids[1]})"

wait -n
status=$?
if [[ $stopping == 0 ]]; then
    echo "run-both: a process exited with status ${status}; stopping the other"
    stop
else
    echo "run-both: stopping both"
fi
wait_all
exit "$status"
