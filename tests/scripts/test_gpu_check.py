"""scripts/gpu_check.py: its device plan, and the whole check on CPUs (gloo) so it cannot rot
between the runs on GPU machines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scripts.gpu_check import CheckFailed, plan, server_args

REPO = Path(__file__).resolve().parents[2]


def test_plan_follows_the_gpus() -> None:
    assert plan("cpu", 0)["backend"] == "gloo"
    two = plan("cuda", 2)
    assert (two["server"], two["learner"], two["backend"]) == ("cuda:1", "cuda:0", "nccl")
    one = plan("cuda", 1)
    assert one["server"] == one["learner"] == "cuda:0" and "IPC" in one["path"]
    with pytest.raises(CheckFailed, match="no CUDA device"):
        plan("cuda", 0)
    forced = plan("cuda", 2, "ipc")  # both on one GPU although there are two
    assert forced["server"] == forced["learner"] == "cuda:0" and forced["server_gpu"] == "0"
    with pytest.raises(CheckFailed, match="needs two GPUs"):
        plan("cuda", 1, "nccl")
    # the server sees only its own GPU; vLLM leaves room when it shares the learner's
    assert server_args(two, "hf") == (["--engine", "hf", "--device", "cuda:0"],
                                      {"CUDA_VISIBLE_DEVICES": "1"})
    assert server_args(two, "vllm") == (["--engine", "vllm"], {"CUDA_VISIBLE_DEVICES": "1"})
    assert server_args(one, "vllm") == (
        ["--engine", "vllm", "--gpu-memory-utilization", "0.3"], {"CUDA_VISIBLE_DEVICES": "0"})
    assert server_args(plan("cpu", 0), "hf") == (["--engine", "hf", "--device", "cpu"], {})


@pytest.mark.slow
def test_gpu_check_passes_on_cpu(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--steps", "2",
         "--timeout-s", "300", "--json", str(tmp_path / "s.json"),
         "--run-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=420,
        env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"],
             "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "---- gspo gpu_check summary ----" in out.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["result"] == "PASS" and summary["server_policy_version"] == 2
    assert summary["logprob_gap"] < 1e-4


def test_gpu_check_fails_clearly_without_a_gpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cuda"],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]})
    assert out.returncode == 1 and "result: FAIL" in out.stdout
    assert "no CUDA device" in out.stdout


def test_gpu_learner_bench_fails_clearly_without_a_gpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = subprocess.run(["bash", "scripts/gpu_learner_bench.sh", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 1 and "no CUDA device" in out.stderr


def _run_check(tmp_path: Path, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", *args, "--steps", "2", "--timeout-s", "400",
         "--json", str(tmp_path / "s.json"), "--run-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=500,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads((tmp_path / "s.json").read_text())


@pytest.mark.gpu
def test_one_gpu_loop_passes_weights_by_cuda_ipc(tmp_path: Path) -> None:
    """Finding 4: server and learner on one GPU train, the learner picks CUDA IPC by itself,
    and the server then samples exactly the learner's policy (float32, 1e-4)."""
    s = _run_check(tmp_path, "--device", "cuda", "--path", "ipc")
    assert s["transport_chosen"] == "ipc" and s["logprob_gap"] < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpu_loop_broadcasts_over_nccl(tmp_path: Path) -> None:
    """Finding 1 end to end: the NCCL broadcast reaches a server on another GPU."""
    s = _run_check(tmp_path, "--device", "cuda", "--path", "nccl")
    assert s["transport_chosen"] == "nccl" and s["logprob_gap"] < 1e-4
