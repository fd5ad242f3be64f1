"""LoRA against full fine-tuning, same model and batch, in one run: the learner's peak memory
and step time, and the weight push's bytes and seconds (gloo, to a real ``gspo serve``).

    .venv/bin/python benchmarks/bench_lora.py [--shape small|0.5b] [--rank 8] [--steps 3]
        [--groups 4 --group-size 4 --prompt 64 --completion 192] [--repeats 5] [--no-push]
    .venv/bin/python benchmarks/bench_lora.py --merge --shape 0.5b   # a server's merge alone
    python benchmarks/bench_lora.py --device cuda --shape 8b --modes lora   # on a GPU

Learner: each mode (``full``: every weight trains; ``lora``: rank-``r`` adapters on every
attention and MLP projection, alpha 2r, the base frozen) runs ``Trainer.step`` in a fresh
process on a freshly initialised model of the shape: one warm-up step, then the median of
``--steps`` timed steps. Memory on the CPU: the process's resident high-water mark
(``ru_maxrss``) and its growth over the resident size once the model is loaded (that growth
is the training state: gradients, AdamW moments, activations); on CUDA
``max_memory_allocated``, with tokens/s and MFU (``bench_learner.step_flops``: the 6N
convention, which LoRA's skipped weight gradients make an over-count of its work by ~1.5x).
On CUDA the model is made on the GPU in bf16 (the learner's default there) and the server
runs there too, in bf16, so the push goes over CUDA IPC. Push: ``BroadcastSync.push`` of
the full model, then of the LoRA model's adapters, to one hf-engine server started on the
shape's weights (median of ``--repeats`` steady-state pushes each; the first builds the
group and is left out). ``--merge``: only the server's merge of an adapter into its
weights, ``BaseCopy.merge`` plus a copy against ``BaseCopy.merge_into``, in one process.
Ratios are LoRA / full (``--modes``: both by default; full fine-tuning of ``8b`` fits no
80 GB GPU). Shapes: ``small`` (hidden 512, 8 layers, vocabulary 32768: ~39M parameters),
``0.5b``/``1.5b`` (Qwen2.5 dimensions), ``8b`` (Qwen3-8B's: hidden 4096, 36 layers, 32/8
heads, untied 151,936 vocabulary) and ``tiny`` (the smoke test's), random weights made
locally.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# hidden, layers, heads, kv heads, intermediate, vocabulary
SHAPES = {"tiny": (128, 2, 2, 1, 256, 1024), "small": (512, 8, 8, 2, 1408, 32768),
          "0.5b": (896, 24, 14, 2, 4864, 151936), "1.5b": (1536, 28, 12, 2, 8960, 151936),
          "8b": (4096, 36, 32, 8, 12288, 151936)}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(shape: str, device: str = "cpu") -> torch.nn.Module:
    """Random weights of ``shape``: float32 on the CPU, bf16 made on the GPU on CUDA."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    h, layers, heads, kv, inter, vocab = SHAPES[shape]
    cfg = Qwen2Config(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                      tie_word_embeddings=shape != "8b", max_position_embeddings=4096,
                      attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype)


def learner_worker(args: argparse.Namespace) -> None:
    """One mode's trainer in this (fresh) process; prints one JSON line."""
    from bench_learner import make_groups, peak_flops, step_flops

    from gspo_rl.learner.config import LearnerConfig
    from gspo_rl.learner.model.lora import apply_lora, count_params
    from gspo_rl.learner.model.policy import Policy
    from gspo_rl.learner.trainer import Trainer

    device = torch.device(args.device)
    model = build(args.shape, args.device)
    lora = {"lora_rank": args.rank, "lora_alpha": 2.0 * args.rank} if args.mode == "lora" \
        else {}
    cfg = LearnerConfig(model=args.shape, lr=1e-5, minibatches=1,
                        micro_batch_tokens=args.micro_batch_tokens, **lora)
    peft = apply_lora(model, cfg) if lora else None
    trainable, total = count_params(model)
    base_rss = psutil.Process().memory_info().rss
    trainer = Trainer(Policy(model, device, peft=peft), cfg)
    groups = make_groups(SHAPES[args.shape][5], args.groups, args.group_size, args.prompt,
                         args.completion)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer.step(groups)  # warm-up
    secs = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        m = trainer.step(groups)
        secs.append(time.perf_counter() - t0)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"mode": args.mode, "trainable": trainable, "total": total,
           "step_s": statistics.median(secs), "tokens": m["tokens"],
           "peak_rss": peak_rss, "train_rss": peak_rss - base_rss}
    if device.type == "cuda":
        out["cuda_peak"] = torch.cuda.max_memory_allocated(device)
        out["tokens_s"] = m["tokens"] / out["step_s"]
        peak = peak_flops(device, None)
        out["mfu"] = step_flops(model, groups) / out["step_s"] / peak if peak else None
    print(json.dumps(out), flush=True)


def learner_case(args: argparse.Namespace, mode: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--mode", mode, "--shape", args.shape,
           "--rank", str(args.rank), "--steps", str(args.steps), "--groups", str(args.groups),
           "--group-size", str(args.group_size), "--prompt", str(args.prompt),
           "--completion", str(args.completion), "--device", args.device,
           "--micro-batch-tokens", str(args.micro_batch_tokens)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT / "benchmarks")
    if res.returncode:
        raise SystemExit(f"{mode} learner failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def push_case(args: argparse.Namespace, root: Path) -> dict[str, tuple[float, int, str]]:
    """{mode: (median push seconds, bytes, transport)} to one real server, full pushes then
    adapters."""
    import redis
    from bench_weight_sync import ADMIN, start_servers, stop_servers
    from peft import LoraConfig, get_peft_model

    from gspo_rl.contract.schema import Keys
    from gspo_rl.learner.weights.broadcast import BroadcastSync
    from gspo_rl.tiny_model import make_tiny_model
    from tests.conftest import RedisServer

    model_dir = root / args.shape
    model = build(args.shape, args.device)
    model.save_pretrained(model_dir, safe_serialization=True)
    for f in make_tiny_model(root / "tok").iterdir():  # token ids only: nothing is decoded
        if "token" in f.name or f.name.endswith(".jinja"):
            shutil.copy(f, model_dir / f.name)
    rs = RedisServer(dir=Path(tempfile.mkdtemp(dir=root)))
    rs.start()
    gpu = ["--device", args.device, "--dtype", "bfloat16"] if args.device != "cpu" else []
    procs = start_servers(model_dir, 1, rs.url, root, extra=gpu)
    out: dict[str, tuple[float, int, str]] = {}
    try:
        sync = BroadcastSync(redis.Redis.from_url(rs.url), Keys(), admin_key=ADMIN,
                             timeout_s=600)
        version = 0
        for mode in ("full", "lora"):
            if mode == "lora":
                get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                 target_modules=TARGETS))
            times, nbytes = [], 0
            for k in range(args.repeats + 1):
                version += 1
                rep = sync.push(model, version=version)
                assert rep.ok and rep.lora == (mode == "lora"), rep
                if k:  # the first push of a mode is left out (group, W0 copy)
                    times.append(rep.seconds)
                nbytes = rep.bytes_sent
            out[mode] = (statistics.median(times), nbytes,
                         "cuda-ipc" if rep.ipc_servers else sync.backend)
        sync.close()
    finally:
        stop_servers(procs, rs)
    return out


def merge_case(args: argparse.Namespace) -> None:
    """A server's adapter merge alone, on the shape's projections: ``BaseCopy.merge`` and a
    copy into the weights (vLLM's merge path; the hf engine's before ``merge_into``) against
    ``BaseCopy.merge_into`` (the hf engine's), median of ``--repeats`` each, alternating."""
    from gspo_rl.contract.weights.lora import BaseCopy, LoraSpec

    model = build(args.shape, args.device)
    params = {n: p for n, p in model.named_parameters()
              if n.endswith(".weight") and n.split(".")[-2] in TARGETS}
    torch.manual_seed(1)
    named = [(n[:-len(".weight")] + suffix, 0.01 * torch.randn(shape, device=args.device))
             for n, w in params.items()
             for suffix, shape in ((".lora_A.weight", (args.rank, w.shape[1])),
                                   (".lora_B.weight", (w.shape[0], args.rank)))]
    spec = LoraSpec(rank=args.rank, alpha=2 * args.rank, target_modules=TARGETS)
    listed, in_place = BaseCopy(), BaseCopy()

    @torch.no_grad()
    def by_list() -> None:
        for n, w in listed.merge(params, named, spec):
            params[n].copy_(w)

    times: dict[str, list[float]] = {"listed": [], "in place": []}
    for k in range(args.repeats + 1):  # the first of each takes W0 and is left out
        for name, fn in (("listed", by_list),
                         ("in place", lambda: in_place.merge_into(params, named, spec))):
            t0 = time.perf_counter()
            fn()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            if k:
                times[name].append(time.perf_counter() - t0)
    n = sum(w.numel() for w in params.values())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"merge of {len(params)} projections ({n / 1e6:.1f}M weights, "
          f"{next(iter(params.values())).dtype}): " + ", ".join(
              f"{k} {v * 1000:.1f} ms" for k, v in med.items()))
    print(f"ratio in place / listed: merge time {med['in place'] / med['listed']:.2f}")


def report_learner(res: dict[str, dict]) -> None:
    mib = 2**20
    print(f"{'mode':5} {'trainable':>13} {'total':>14} {'step s':>8} {'peak RSS MiB':>13} "
          f"{'train RSS MiB':>14}")
    for m, r in res.items():
        print(f"{m:5} {r['trainable']:13,} {r['total']:14,} {r['step_s']:8.3f} "
              f"{r['peak_rss'] / mib:13.0f} {r['train_rss'] / mib:14.0f}"
              + (f"  cuda peak {r['cuda_peak'] / mib:.0f} MiB, {r['tokens']:.0f} tokens, "
                 f"{r['tokens_s']:,.0f} tokens/s, MFU "
                 + (f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "n/a (unknown GPU)")
                 if "cuda_peak" in r else ""))
    if "full" in res and "lora" in res:
        f, lo = res["full"], res["lora"]
        print(f"ratio lora/full: step time {lo['step_s'] / f['step_s']:.2f}, peak RSS "
              f"{lo['peak_rss'] / f['peak_rss']:.2f}, training-state RSS "
              f"{lo['train_rss'] / max(f['train_rss'], 1):.2f}"
              + (f", cuda peak {lo['cuda_peak'] / f['cuda_peak']:.2f}"
                 if "cuda_peak" in f else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=192)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-push", action="store_true")
    ap.add_argument("--merge", action="store_true",
                    help="only time a server's adapter merge: listed vs in place")
    ap.add_argument("--modes", default="full,lora", help="learner modes to run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("full", "lora"), default="full", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        learner_worker(args)
        return
    if args.merge:
        merge_case(args)
        return
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, shape {args.shape}, "
          f"rank {args.rank}, {args.groups}x{args.group_size} rollouts of {args.prompt} + "
          f"{args.completion // 2}..{args.completion} tokens, device {args.device}")
    res = {m: learner_case(args, m) for m in args.modes.split(",")}
    report_learner(res)
    if args.no_push:
        return
    root = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    push = push_case(args, root)
    for m, (s, b, via) in push.items():
        print(f"push {m:5} {b / 2**20:10.2f} MiB {s * 1000:9.1f} ms  ({via})")
    print(f"ratio lora/full: push bytes {push['lora'][1] / push['full'][1]:.4f}, push time "
          f"{push['lora'][0] / push['full'][0]:.3f}")


if __name__ == "__main__":
    main()
