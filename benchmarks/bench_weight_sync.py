"""Seconds to push a model's weights to 1 and 2 rollout servers vs a raw broadcast of the bytes.

    .venv/bin/python benchmarks/bench_weight_sync.py [--models tiny,0.5b] [--servers 1,2]

Ours: ``gspo_rl.learner.weights.broadcast.BroadcastSync.push`` to real ``gspo serve`` processes (hf
engine): the HTTP control messages, the bucketed gloo broadcast, each server receiving every bucket,
pausing, loading into its model and bumping its version. The first push also builds the
process group; the table reports it separately and the steady-state median of later pushes.
Baseline, same run: ``torch.distributed`` broadcast of the same bytes with the same bucket
plan to the same number of bare receiver processes (no HTTP, no load). Goal: steady-state
ratio <= 1.5.

``0.5b`` is a randomly initialised Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads,
2 KV heads, vocabulary 151,936, tied embeddings: ~494M parameters, ~2 GB in float32), made
locally. ``--learner`` also prints the learner's tokens/s on each model
(``benchmarks/bench_learner.py``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gspo_rl.contract.schema import Keys  # noqa: E402
from gspo_rl.contract.weights.collective import (  # noqa: E402
    DEFAULT_BUCKET_BYTES,
    host_store,
    make_process_group,
    receive_tensors,
    send_tensors,
    tensor_metas,
)
from gspo_rl.learner.weights.broadcast import BroadcastSync, named_weights  # noqa: E402
from gspo_rl.redisq.registry import live_servers  # noqa: E402
from tests.conftest import RedisServer, free_port  # noqa: E402

ADMIN = "bench-admin-key"


def make_model(kind: str, root: Path) -> Path:
    from gspo_rl.tiny_model import make_tiny_model

    tiny = make_tiny_model(root / "tiny")
    if kind == "tiny":
        return tiny
    from transformers import AutoModelForCausalLM, Qwen2Config

    path = root / "qwen2-0.5b-shaped"
    cfg = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                      max_position_embeddings=4096, tie_word_embeddings=True,
                      torch_dtype="float32")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path, safe_serialization=True)
    for f in tiny.iterdir():  # the tokenizer: token ids only, nothing is decoded
        if "token" in f.name or f.name.endswith(".jinja"):
            shutil.copy(f, path / f.name)
    return path


def start_servers(model: Path, n: int, redis_url: str, logs: Path,
                  extra: list[str] | tuple[str, ...] = ()) -> list[subprocess.Popen]:
    procs = []
    env = {**os.environ, "GSPO_ADMIN_KEY": ADMIN, "GSPO_API_KEY": "bench"}
    for i in range(n):
        port = free_port()
        log = open(logs / f"server{i}.log", "wb")  # noqa: SIM115
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gspo_rl.cli", "serve", "--model", str(model), "--port",
             str(port), "--redis-url", redis_url, "--server-id", f"bench-{i}",
             "--log-level", "warning", *extra], stdout=log, stderr=subprocess.STDOUT, env=env))
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 600
    while len(live_servers(client, Keys())) < n:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"servers did not start; see {logs}")
        time.sleep(0.5)
    return procs


def stop_servers(procs: list[subprocess.Popen], rs: Any) -> None:
    """Terminate ``start_servers``' processes, wait for them, then stop Redis."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=60)
    rs.stop()


def ours(model_dir: Path, n: int, repeats: int, root: Path) -> tuple[float, float, int]:
    """(first push s, steady median s, bytes) through real servers."""
    from transformers import AutoModelForCausalLM

    rs = RedisServer(dir=Path(tempfile.mkdtemp(dir=root)))
    rs.start()
    procs = start_servers(model_dir, n, rs.url, root)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        sync = BroadcastSync(redis.Redis.from_url(rs.url), Keys(), admin_key=ADMIN,
                             timeout_s=600)
        first = sync.push(model, version=1)
        assert first.ok and len(first.servers) == n, first
        times = []
        for v in range(2, repeats + 2):
            rep = sync.push(model, version=v)
            assert rep.ok and not rep.rebuilt, rep
            times.append(rep.seconds)
        for info in live_servers(redis.Redis.from_url(rs.url), Keys()):
            health = httpx.get(f"{info.url}/health", timeout=30).json()
            assert health["policy_version"] == repeats + 1, health  # every server is current
        sync.close()
        return first.seconds, statistics.median(times), first.bytes_sent
    finally:
        stop_servers(procs, rs)


def _raw_receiver(port: int, world: int, rank: int, metas: list, repeats: int) -> None:
    pg = make_process_group("gloo", "127.0.0.1", port, rank, world, 0, timeout_s=600)
    for _ in range(repeats):
        for _name, _t in receive_tensors(pg, metas, DEFAULT_BUCKET_BYTES, 600):
            pass


def raw(model_dir: Path, n: int, repeats: int) -> float:
    """Median seconds of a bare bucketed broadcast of the same tensors."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    named = named_weights(model)
    metas = tensor_metas(named)
    port = free_port()
    store = host_store("127.0.0.1", port, 600)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_raw_receiver, args=(port, n + 1, r, metas, repeats))
             for r in range(1, n + 1)]
    for p in procs:
        p.start()
    pg = make_process_group("gloo", "127.0.0.1", port, 0, n + 1, 0, 600, store=store)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        send_tensors(pg, named, DEFAULT_BUCKET_BYTES, 600)
        times.append(time.perf_counter() - t0)
    for p in procs:
        p.join(timeout=600)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,0.5b")
    ap.add_argument("--servers", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--learner", action="store_true", help="also learner tokens/s per model")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, logs in {root}")
    print(f"{'model':6} {'servers':>7} {'MB':>8} {'first push s':>12} {'push s':>8} "
          f"{'raw bcast s':>11} {'ratio':>6}")
    for kind in args.models.split(","):
        model_dir = make_model(kind, root / kind)
        for n in (int(x) for x in args.servers.split(",")):
            first, steady, nbytes = ours(model_dir, n, args.repeats, root)
            base = raw(model_dir, n, args.repeats)
            print(f"{kind:6} {n:7d} {nbytes / 2**20:8.1f} {first:12.3f} {steady:8.3f} "
                  f"{base:11.3f} {steady / base:6.2f}", flush=True)
        if args.learner:
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_learner.py"),
                            "--model", str(model_dir), "--groups", "2", "--group-size", "4",
                            "--prompt", "64", "--completion", "192", "--steps", "2",
                            "--minibatches", "1"], check=False)
    print("goal: push / raw broadcast <= 1.5 (steady state)")


if __name__ == "__main__":
    main()
