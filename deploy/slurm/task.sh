#!/usr/bin/env bash
# One task of a gspo Slurm job: `srun ... task.sh redis | server | learner | env` (gspo.sbatch
# launches them; nothing here allocates anything). Reads the configuration (GSPO_SLURM_CONFIG),
# the run's secrets file and what gspo.sbatch exported (GSPO_JOB_DIR, GSPO_REDIS_HOST, ...).
#
# Stopping: Slurm signals the task process itself (proctrack/cgroup signals a step's tasks,
# not their children), possibly twice (scancel, then the batch script's trap). Each role passes
# one SIGTERM on: the learner's to its torchrun workers (rank 0 finishes its step, checkpoints,
# acknowledges, tells the other ranks to stop; torchrun then exits 0); Redis's and the run's
# servers' only once the learner has exited (its last push and acknowledgements land).
set -euo pipefail
role=${1:?usage: task.sh redis|server|learner|env}
GSPO_ROLE_NAME="$role${SLURM_PROCID:+ $SLURM_PROCID}"
# shellcheck source=deploy/slurm/lib.sh
source "$GSPO_SLURM_DIR/lib.sh"
gspo_load_config
gspo_load_secrets
gspo_export_secrets "$role"
: "${GSPO_JOB_DIR:?set by gspo.sbatch}"
# CPU threads: what Slurm gave this task (per process), unless the caller chose.
threads=${SLURM_CPUS_PER_TASK:-1}
if [ "$role" = learner ]; then threads=$(( threads / GSPO_LEARNER_PROCS_PER_NODE )); fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}

# On a plain scancel every step is signalled at once. Redis and the job's own servers outlive
# the learner (up to GSPO_STOP_GRACE_S): its last step's push then reaches live servers (a
# server that went away mid-push would cost it sync_timeout_s), and its final checkpoint's
# acknowledgements reach Redis.
learner_exited() {
    local waited=0
    while [ ! -e "$GSPO_JOB_DIR/learner.exited" ] && (( waited < GSPO_STOP_GRACE_S )); do
        if (( waited % 10 == 0 )); then gspo_log "stopping: waiting for the learner to exit"; fi
        sleep 1
        waited=$((waited + 1))
    done
}

task_redis() {
    mkdir -p "$GSPO_REDIS_DIR"
    local conf="$GSPO_JOB_DIR/redis.conf"
    # The password lives in this file (mode 600), never on a command line.
    (
        umask 077
        cat > "$conf" <<EOF
port $GSPO_REDIS_PORT
bind 0.0.0.0
protected-mode yes
requirepass $GSPO_REDIS_PASSWORD
dir $GSPO_REDIS_DIR
appendonly yes
appendfsync everysec
save ""
daemonize no
EOF
    )
    GSPO_BEFORE_STOP=learner_exited
    gspo_log "redis-server on port $GSPO_REDIS_PORT, append-only file in $GSPO_REDIS_DIR"
    gspo_run_forwarding "$GSPO_REDIS_SERVER" "$conf"
}

task_server() {
    local idx=$SLURM_PROCID port addr
    port=$((GSPO_SERVER_PORT + idx))
    addr=$(gspo_node_addr "$SLURMD_NODENAME")
    local args=(serve --model "$GSPO_MODEL" --host 0.0.0.0 --port "$port"
                --advertise-url "http://$addr:$port" --server-id "$GSPO_SERVER_ID_PREFIX$idx"
                --key-prefix "$GSPO_KEY_PREFIX")
    if (( GSPO_SERVER_GPUS > 1 )); then
        args+=(--tensor-parallel-size "$GSPO_SERVER_GPUS")
    fi
    # shellcheck disable=SC2206
    args+=($GSPO_SERVER_ARGS)
    gspo_log "server $GSPO_SERVER_ID_PREFIX$idx on $SLURMD_NODENAME: http://$addr:$port"
    if [ "${GSPO_SLURM_ROLE:-all}" = all ]; then
        GSPO_BEFORE_STOP=learner_exited  # the run's own servers; added ones leave at once
    fi
    gspo_run_forwarding "$GSPO_VENV/bin/gspo" "${args[@]}"
}

task_env() {
    local idx=$SLURM_PROCID urls url
    read -r -a urls <<< "$GSPO_SERVER_URLS"
    url=${urls[$idx]}
    gspo_log "environment $GSPO_ENV against $url (waiting for its /health)"
    gspo_wait_http "$url/health" "${GSPO_SERVER_START_TIMEOUT_S:-1800}"
    # shellcheck disable=SC2086
    exec "$GSPO_VENV/bin/gspo" env "$GSPO_ENV" --url "$url" --groups 0 \
        --seed "$(( ${GSPO_ENV_SEED:-0} + 1000 * SLURM_JOB_ID + idx ))" $GSPO_ENV_ARGS
}

task_learner() {
    local node_rank=$SLURM_PROCID nprocs=$GSPO_LEARNER_PROCS_PER_NODE
    local learn=(learn --model "$GSPO_MODEL" --save-dir "$GSPO_RUN_DIR/checkpoints" --resume
                 --key-prefix "$GSPO_KEY_PREFIX" --config "$GSPO_JOB_DIR/learner.toml")
    # shellcheck disable=SC2206
    learn+=($GSPO_LEARNER_ARGS)
    local cmd
    if (( GSPO_LEARNER_NODES * nprocs == 1 )); then
        cmd=("$GSPO_VENV/bin/gspo" "${learn[@]}")
    else
        # Static rendezvous: node rank = this task's rank in the step, so global rank 0 (which
        # reads the queue, checkpoints and hosts the weight broadcast) is on the first learner
        # node, at the sync_master_addr written into learner.toml.
        cmd=("$GSPO_VENV/bin/torchrun" --nnodes "$GSPO_LEARNER_NODES" --nproc-per-node "$nprocs"
             --node-rank "$node_rank" --master-addr "$GSPO_LEARNER_ADDR"
             --master-port "$GSPO_RDZV_PORT" --max-restarts 0
             -m gspo.cli "${learn[@]}")
    fi
    torchrun_workers() {
        # torchrun forwards a SIGTERM it gets itself and then ends with an error; signalling its
        # workers instead lets rank 0 stop as it would alone, and torchrun exit 0 after them.
        if (( GSPO_LEARNER_NODES * nprocs > 1 )); then
            pgrep -P "$GSPO_CHILD" | tr '\n' ' ' || true
        fi
    }
    GSPO_STOP_TARGETS=torchrun_workers
    gspo_log "learner node rank $node_rank of $GSPO_LEARNER_NODES ($nprocs process(es)) on $SLURMD_NODENAME"
    local rc=0
    gspo_run_forwarding "${cmd[@]}" || rc=$?
    gspo_log "learner exited with status $rc"
    if (( node_rank == 0 )); then
        echo "$rc" > "$GSPO_JOB_DIR/learner.exited"
    fi
    return "$rc"
}

case "$role" in
    redis) task_redis ;;
    server) task_server ;;
    env) task_env ;;
    learner) task_learner ;;
    *) gspo_die "unknown role $role" ;;
esac
