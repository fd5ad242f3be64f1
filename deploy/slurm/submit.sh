#!/usr/bin/env bash
# Submit a gspo-rl run to Slurm, its allocation sized from a configuration file:
#
#   deploy/slurm/submit.sh CONFIG [sbatch options...]                 # the run (resumes if it can)
#   deploy/slurm/submit.sh --add-servers CONFIG [sbatch options...]   # more servers, same run
#
# CONFIG is a bash file of VAR=${VAR:-default} lines (deploy/slurm/cpu.env, gpu.env); the
# environment overrides it. sbatch options (--time, --partition, --account, --dependency ...)
# pass through. Prints the job id (GSPO_SLURM_DRY_RUN=1: the sbatch command instead, and submits
# nothing). docs/deployment/slurm.md explains every variable.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
role=all
if [ "${1:-}" = --add-servers ]; then
    role=servers
    shift
fi
[ $# -ge 1 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
GSPO_SLURM_CONFIG=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
export GSPO_SLURM_CONFIG GSPO_SLURM_DIR="$here" GSPO_SLURM_ROLE=$role
# shellcheck source=deploy/slurm/lib.sh
source "$here/lib.sh"
gspo_load_config
mkdir -p "$GSPO_RUN_DIR"

max() { if (( $1 > $2 )); then echo "$1"; else echo "$2"; fi; }
per=$GSPO_SERVERS_PER_NODE
# Per server node: its servers and their environments.
s_cpus=$(( per * GSPO_SERVER_CPUS )); s_mem=$(( per * GSPO_SERVER_MEM ))
if [ -n "$GSPO_ENV" ]; then
    s_cpus=$(( s_cpus + per * GSPO_ENV_CPUS )); s_mem=$(( s_mem + per * GSPO_ENV_MEM ))
fi
s_gpus=$(( per * GSPO_SERVER_GPUS ))
if [ "$role" = all ]; then
    nodes=$(( GSPO_LEARNER_NODES + GSPO_SERVER_NODES ))
    # Per learner node: the learner, and Redis on the first one (every node is sized alike).
    cpus=$(max $(( GSPO_LEARNER_CPUS_PER_NODE + GSPO_REDIS_CPUS )) "$s_cpus")
    mem=$(max $(( GSPO_LEARNER_MEM + GSPO_REDIS_MEM )) "$s_mem")
    gpus=$(max "$GSPO_LEARNER_GPUS_PER_NODE" "$s_gpus")
    name=$GSPO_JOB_NAME
else
    nodes=$GSPO_SERVER_NODES; cpus=$s_cpus; mem=$s_mem; gpus=$s_gpus
    name="$GSPO_JOB_NAME-servers"
fi
args=(--parsable --job-name="$name" --nodes="$nodes" --ntasks-per-node=1
      --cpus-per-task="$cpus" --mem="$mem" --output="$GSPO_RUN_DIR/slurm-%j.out"
      --signal="B:TERM@$GSPO_STOP_GRACE_S"
      --export="ALL,GSPO_SLURM_CONFIG=$GSPO_SLURM_CONFIG,GSPO_SLURM_DIR=$here,GSPO_SLURM_ROLE=$role")
if [ "$role" = all ]; then
    # A resubmitted run starts only once the job of the same name (the run's previous one,
    # maybe still stopping) has ended: two learners never share a run's queue.
    args+=(--dependency=singleton)
fi
if (( gpus > 0 )); then
    args+=(--gpus-per-node="$gpus")
fi
if [ "${GSPO_SLURM_DRY_RUN:-0}" = 1 ]; then  # print what would be submitted
    printf '%q ' sbatch "${args[@]}" "$@" "$here/gspo.sbatch"
    echo
    exit 0
fi
exec sbatch "${args[@]}" "$@" "$here/gspo.sbatch"
