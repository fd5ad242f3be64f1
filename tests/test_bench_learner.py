"""benchmarks/bench_learner.py runs end to end at tiny sizes (no timing asserts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_learner.py"), *args],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_trainer_benchmark_prints_both_rows_and_the_ratio():
    out = _run("--device", "cpu", "--shape", "tiny", "--groups", "2", "--group-size", "2",
               "--prompt", "8", "--completion", "16", "--steps", "1", "--minibatches", "1")
    assert "tokens per step" in out
    rows = [line for line in out.splitlines() if "tokens/s" in line]
    assert [r.split()[0] for r in rows] == ["ours", "baseline"]
    assert "throughput ratio ours/baseline" in out


def test_head_benchmark_compares_fused_and_plain():
    out = _run("--device", "cpu", "--head", "--tokens", "64", "--vocab", "512", "--hidden",
               "32", "--steps", "1")
    assert "fused" in out and "plain" in out and "time ratio fused/plain" in out
