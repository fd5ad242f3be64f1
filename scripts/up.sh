#!/usr/bin/env bash
# Set up everything (scripts/setup.sh), then run the main job: `gspo up` (Redis, a rollout
# server, the learner and the demo environment on this CPU; see README). Args go to `gspo up`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/gspo up "$@"
