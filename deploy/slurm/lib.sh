# Shared functions of the gspo Slurm scripts (sourced by submit.sh, gspo.sbatch and task.sh).
# Nothing here starts anything by itself. Every wait is bounded and says what it waits for.

gspo_log() {
    printf '%s [gspo-slurm %s] %s\n' "$(date '+%F %T')" "${GSPO_ROLE_NAME:-job}" "$*" >&2
}

gspo_die() {
    gspo_log "ERROR: $*"
    exit 2
}

# Source the configuration (GSPO_SLURM_CONFIG: a bash file of VAR=${VAR:-default} lines, so
# that the environment overrides it), then check and derive what every script needs.
gspo_load_config() {
    [ -n "${GSPO_SLURM_CONFIG:-}" ] || gspo_die "GSPO_SLURM_CONFIG is not set (a config file such as deploy/slurm/cpu.env)"
    [ -f "$GSPO_SLURM_CONFIG" ] || gspo_die "config file not found: $GSPO_SLURM_CONFIG"
    # shellcheck disable=SC1090
    source "$GSPO_SLURM_CONFIG"
    local v
    for v in GSPO_RUN_DIR GSPO_VENV GSPO_MODEL GSPO_LEARNER_NODES GSPO_LEARNER_PROCS_PER_NODE \
             GSPO_SERVER_NODES GSPO_SERVERS GSPO_SERVER_PORT GSPO_REDIS_PORT GSPO_RDZV_PORT; do
        [ -n "${!v:-}" ] || gspo_die "$v is not set (in $GSPO_SLURM_CONFIG or the environment)"
    done
    : "${GSPO_LEARNER_GPUS_PER_NODE:=0}" "${GSPO_LEARNER_CPUS_PER_NODE:=4}" "${GSPO_LEARNER_MEM:=8000}"
    : "${GSPO_SERVER_GPUS:=0}" "${GSPO_SERVER_CPUS:=2}" "${GSPO_SERVER_MEM:=4000}"
    : "${GSPO_REDIS_CPUS:=1}" "${GSPO_REDIS_MEM:=2000}" "${GSPO_REDIS_DIR:=$GSPO_RUN_DIR/redis}"
    : "${GSPO_ENV:=}" "${GSPO_ENV_ARGS:=}" "${GSPO_ENV_CPUS:=1}" "${GSPO_ENV_MEM:=1000}"
    : "${GSPO_LEARNER_CONFIG:=}" "${GSPO_LEARNER_ARGS:=}" "${GSPO_SERVER_ARGS:=}"
    : "${GSPO_KEY_PREFIX:=gspo}" "${GSPO_STOP_GRACE_S:=120}"
    : "${GSPO_JOB_NAME:=gspo-$(basename "$GSPO_RUN_DIR")}"
    : "${GSPO_MAKE_TINY_MODEL:=0}" "${GSPO_REDIS_SERVER:=redis-server}"
    : "${GSPO_SECRETS_FILE:=$GSPO_RUN_DIR/secrets.env}"
    if (( GSPO_SERVERS % GSPO_SERVER_NODES != 0 )); then
        gspo_die "GSPO_SERVERS ($GSPO_SERVERS) must be a multiple of GSPO_SERVER_NODES ($GSPO_SERVER_NODES)"
    fi
    GSPO_SERVERS_PER_NODE=$(( GSPO_SERVERS / GSPO_SERVER_NODES ))
    GSPO_PY="$GSPO_VENV/bin/python"
    [ -x "$GSPO_PY" ] || gspo_die "no python at $GSPO_PY (GSPO_VENV must be the same path on every node)"
    export GSPO_RUN_DIR GSPO_VENV GSPO_MODEL GSPO_KEY_PREFIX GSPO_SECRETS_FILE GSPO_PY
}

# The secrets of a run (Redis password, admin key, API key): made once per run directory in a
# file only its owner can read, reused by every later job (Redis keeps no password in its AOF).
# Never on a command line: tasks read the file, the processes get them from their environment.
gspo_ensure_secrets() {
    if [ -f "$GSPO_SECRETS_FILE" ]; then
        return
    fi
    local tok
    tok() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }
    (
        umask 077
        mkdir -p "$(dirname "$GSPO_SECRETS_FILE")"
        printf 'GSPO_REDIS_PASSWORD=%s\nGSPO_ADMIN_KEY=%s\nGSPO_API_KEY=%s\n' \
            "$(tok)" "$(tok)" "$(tok)" > "$GSPO_SECRETS_FILE.tmp.$$"
        mv "$GSPO_SECRETS_FILE.tmp.$$" "$GSPO_SECRETS_FILE"
    )
    gspo_log "made the run's secrets: $GSPO_SECRETS_FILE (mode 600)"
}

# Read the run's secrets into shell variables (not exported): each task exports only what its
# process needs (gspo_export_secrets), so no secret travels in a job step's environment.
gspo_load_secrets() {
    [ -f "$GSPO_SECRETS_FILE" ] || gspo_die "no secrets file $GSPO_SECRETS_FILE"
    # shellcheck disable=SC1090
    source "$GSPO_SECRETS_FILE"
    # The URL holds the password: a process's environment only (server and learner read it).
    GSPO_REDIS_URL="redis://:${GSPO_REDIS_PASSWORD}@${GSPO_REDIS_HOST}:${GSPO_REDIS_PORT}/0"
}

# What each role holds (as in docker-compose.yml): the servers the API key, the admin key and
# Redis; the learner the admin key and Redis; an environment only the API key; Redis its
# password, in its config file.
gspo_export_secrets() {
    export -n GSPO_API_KEY GSPO_ADMIN_KEY GSPO_REDIS_URL GSPO_REDIS_PASSWORD 2>/dev/null || true
    case "$1" in
        server) export GSPO_API_KEY GSPO_ADMIN_KEY GSPO_REDIS_URL ;;
        learner) export GSPO_ADMIN_KEY GSPO_REDIS_URL ;;
        env) export GSPO_API_KEY ;;
        redis) ;;
        *) gspo_die "no secrets for role $1" ;;
    esac
}

# The address Slurm itself reaches NODE at (its NodeAddr; the node's name unless the cluster
# sets another). Every component is reached at its node's NodeAddr.
gspo_node_addr() {
    local addr
    addr=$(scontrol show node -o "$1" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
    [ -n "$addr" ] || gspo_die "no NodeAddr for node $1"
    printf '%s\n' "$addr"
}

# Send SIG to every task of this job's steps named NAME (srun --job-name). Slurm delivers it to
# each task process (with proctrack/cgroup: the task itself, not its children).
gspo_signal_step() {
    local name=$1 sig=$2 id sname out
    while read -r id sname; do
        if [ "$sname" = "$name" ]; then
            gspo_log "signal $sig to step $id ($name)"
            # --ctld: through slurmctld, to the step's own nodes (sent directly, Slurm 22.05
            # also asks the job's other nodes, which answer "Invalid job id").
            if ! out=$(scancel --ctld --signal="$sig" "$id" 2>&1); then
                gspo_log "scancel $id: $out (expected while Slurm cancels the job itself: its" \
                    "steps have had Slurm's own SIGTERM)"
            fi
        fi
    done < <(squeue --steps --noheader --jobs "$SLURM_JOB_ID" --format '%i %j' 2>/dev/null || true)
}

# Wait (at most $2 s) until the srun whose pid is $1 has exited; SIGKILL its step ($3) then.
gspo_wait_pid() {
    local pid=$1 timeout=$2 step=$3 waited=0
    while kill -0 "$pid" 2>/dev/null; do
        if (( waited >= timeout )); then
            gspo_log "step $step still running after ${timeout}s: killing it"
            gspo_signal_step "$step" KILL
            wait "$pid" 2>/dev/null || true
            return
        fi
        sleep 1
        waited=$((waited + 1))
    done
    wait "$pid" 2>/dev/null || true
}

gspo_wait_redis() {
    local timeout=$1
    GSPO_REDIS_URL=$GSPO_REDIS_URL GSPO_WAIT_TIMEOUT=$timeout "$GSPO_PY" - <<'EOF'
import os, sys, time
import redis
deadline = time.monotonic() + float(os.environ["GSPO_WAIT_TIMEOUT"])
client = redis.Redis.from_url(os.environ["GSPO_REDIS_URL"], socket_timeout=5,
                              socket_connect_timeout=5)
while True:
    try:
        client.ping()
        sys.exit(0)
    except redis.RedisError as exc:
        if time.monotonic() > deadline:
            sys.exit(f"Redis at {os.environ['GSPO_REDIS_HOST']}:{os.environ['GSPO_REDIS_PORT']} "
                     f"did not answer within {os.environ['GSPO_WAIT_TIMEOUT']}s: {exc}")
    time.sleep(0.5)
EOF
}

gspo_wait_http() {
    local url=$1 timeout=$2
    GSPO_WAIT_URL=$url GSPO_WAIT_TIMEOUT=$timeout "$GSPO_PY" - <<'EOF'
import os, sys, time, urllib.request
url, limit = os.environ["GSPO_WAIT_URL"], float(os.environ["GSPO_WAIT_TIMEOUT"])
deadline = time.monotonic() + limit
while True:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            if resp.status == 200:
                sys.exit(0)
    except OSError as exc:
        last = exc
    if time.monotonic() > deadline:
        sys.exit(f"{url} did not answer 200 within {limit}s")
    time.sleep(1)
EOF
}

# Stop requests: `trap gspo_on_signal TERM INT` makes a signal interrupt gspo_wait_child.
GSPO_STOP_ASKED=0
GSPO_TRAPPED=0
gspo_on_signal() {
    GSPO_STOP_ASKED=1
    GSPO_TRAPPED=1
}

# Wait for the child PID ($1) and return its exit status. Once a stop has been asked
# (gspo_on_signal), run the function $2 once, then keep waiting.
gspo_wait_child() {
    local pid=$1 on_stop=$2 rc=0 prev stopped=0
    while :; do
        if (( GSPO_STOP_ASKED && !stopped )); then
            stopped=1
            "$on_stop"
        fi
        GSPO_TRAPPED=0
        prev=$rc
        if wait "$pid"; then rc=0; else rc=$?; fi
        # The child was reaped by an earlier wait that a signal raced with: keep its status.
        if (( rc == 127 && prev != 0 )) && ! kill -0 "$pid" 2>/dev/null; then
            rc=$prev
            break
        fi
        # A trapped signal makes wait return at once (status > 128); wait again.
        if (( GSPO_TRAPPED && rc > 128 )); then
            continue
        fi
        break
    done
    return "$rc"
}

# Run "$@" as a child and return its exit status. The first SIGTERM/SIGINT this shell gets is
# passed on once (Slurm may deliver one stop twice: scancel signals every step, and the batch
# script's trap signals them again). GSPO_STOP_TARGETS (a function name, optional) prints the
# pids to signal instead of the child; GSPO_BEFORE_STOP (a function name, optional) runs
# first (Redis waits there for the learner).
gspo_run_forwarding() {
    trap gspo_on_signal TERM INT
    "$@" &
    GSPO_CHILD=$!
    local rc=0
    gspo_wait_child "$GSPO_CHILD" _gspo_forward_stop || rc=$?
    trap - TERM INT
    return "$rc"
}

_gspo_forward_stop() {
    local pids=""
    if [ -n "${GSPO_BEFORE_STOP:-}" ]; then "$GSPO_BEFORE_STOP"; fi
    if [ -n "${GSPO_STOP_TARGETS:-}" ]; then pids=$("$GSPO_STOP_TARGETS"); fi
    [ -n "${pids// /}" ] || pids=$GSPO_CHILD
    gspo_log "stop requested: SIGTERM to pid(s) $pids"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
}
