"""deploy/slurm/submit.sh sizes the allocation from a configuration (its dry run prints the
sbatch command): no Slurm needed. The job itself runs in tests/deploy/test_slurm.py."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "deploy" / "slurm" / "submit.sh"


def _sbatch_args(tmp_path: Path, config: str, *sbatch: str, add_servers: bool = False,
                 **env: str) -> dict[str, str]:
    run_env = {**os.environ, "GSPO_SLURM_DRY_RUN": "1", "GSPO_RUN_DIR": str(tmp_path / "run"),
               "GSPO_VENV": sys.prefix, "GSPO_MODEL": str(tmp_path / "model"), **env}
    mode = ["--add-servers"] if add_servers else []
    r = subprocess.run(["bash", str(SUBMIT), *mode, str(REPO / "deploy" / "slurm" / config),
                        *sbatch], env=run_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    words = shlex.split(r.stdout)
    assert words[0] == "sbatch" and words[-1].endswith("deploy/slurm/gspo.sbatch"), words
    return dict(w[2:].split("=", 1) if "=" in w else (w[2:], "") for w in words[1:-1])


def test_cpu_variant_asks_for_the_learner_nodes_and_the_server_node(tmp_path):
    a = _sbatch_args(tmp_path, "cpu.env", "--time=10")
    # 2 learner nodes + 1 server node; per node the larger of (learner 1 + Redis 1 CPUs,
    # 3000 + 1000 MB) and (2 servers x (1 + 1 environment) CPUs, 2 x (2000 + 500) MB).
    assert (a["nodes"], a["cpus-per-task"], a["mem"]) == ("3", "4", "5000")
    assert a["signal"] == "B:TERM@60" and a["dependency"] == "singleton"
    assert a["time"] == "10" and "gpus-per-node" not in a
    assert "GSPO_SLURM_ROLE=all" in a["export"] and a["job-name"] == "gspo-run"


def test_gpu_variant_asks_for_gpus_per_node(tmp_path):
    a = _sbatch_args(tmp_path, "gpu.env")
    # learner node: 64 + 2 CPUs, 400000 + 16000 MB, 8 GPUs; server node: 4 servers x (12 + 2)
    # CPUs, 4 x (90000 + 4000) MB, 4 x 2 GPUs.
    assert (a["nodes"], a["cpus-per-task"], a["mem"], a["gpus-per-node"]) == (
        "4", "66", "416000", "8")
    assert a["signal"] == "B:TERM@300"


def test_added_servers_are_their_own_job_without_the_singleton_dependency(tmp_path):
    a = _sbatch_args(tmp_path, "cpu.env", add_servers=True, GSPO_SERVERS="1")
    assert (a["nodes"], a["cpus-per-task"], a["mem"]) == ("1", "2", "2500")
    assert "dependency" not in a and a["job-name"] == "gspo-run-servers"
    assert "GSPO_SLURM_ROLE=servers" in a["export"]


def test_a_layout_that_does_not_divide_is_refused(tmp_path):
    with pytest.raises(AssertionError, match="must be a multiple"):
        _sbatch_args(tmp_path, "cpu.env", GSPO_SERVERS="3", GSPO_SERVER_NODES="2")
