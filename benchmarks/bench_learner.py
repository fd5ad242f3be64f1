"""Learner throughput: ``Trainer.step`` tokens/s, MFU and peak memory, ours against a naive
baseline measured in the same run.

    .venv/bin/python benchmarks/bench_learner.py --shape 0.5b [--micro-batch-tokens 16384
        --groups 16 --group-size 8 --prompt 256 --completion 768 --steps 3 --minibatches 2]
    .venv/bin/python benchmarks/bench_learner.py --suite     # the three GPU cases of issue 16

Shapes: ``tiny`` (2 layers, 128 hidden, vocab 1024; the CPU default), ``0.5b`` and ``1.5b``
(Qwen2.5-0.5B / -1.5B dimensions, random init: nothing is downloaded), or ``--model DIR``.
The batch: ``groups x group-size`` rollouts of ``prompt`` tokens plus a completion of
``completion/2 .. completion`` tokens (defaults: 128 rollouts, 256 + 384..768 tokens).

Ours: the trainer as configured by default (``gspo_rl.learner.model.speed``): on CUDA bf16
parameters with float32 master weights, packed microbatches with variable-length attention, the
fused hidden-state -> log-prob head at trained positions only (Triton softmax passes), fused AdamW,
checkpointing chosen by size, compiled decoder layers. Baseline: full ``[B, T, V]`` logits,
``log_softmax(logits.float() / t).gather(..)``, padded microbatches, float32 weights under
bf16 autocast (on CUDA), stock AdamW, the same checkpointing, no compilation.
Each runs on its own freshly initialised model; on CUDA one after the other (peak memory is
one trainer's; one that runs out of GPU memory is reported as such), on the CPU with steps
alternating between the two (a shared CPU's noise then hits both alike).

MFU (CUDA) = model FLOPs per second / the GPU's dense bf16 peak (989 TFLOP/s for H100/H200
SXM; ``--peak-tflops`` otherwise). Model FLOPs of a step, the same for both implementations:

    6 * (N - N_head) * tokens  +  6 * N_head * trained_tokens  +  sum_seq 6 * l * d * L^2

with ``N`` the parameters that do matmuls (all, the input embedding excluded unless it is
tied to the output head), ``N_head = V * d`` the output projection, counted only for tokens
that get a log-prob (the useful work: prompt tokens need no vocabulary projection), and the
causal attention term per sequence of ``L`` tokens over ``l`` layers of width ``d``
(``QK^T`` and ``PV``: ``2 * 2 * d * L^2 / 2`` forward, three times that with backward). The
recomputation of gradient checkpointing is not counted (MFU, not hardware FLOPs), nor is the
extra forward pass of ``--old-logprobs recompute``.

    .venv/bin/python benchmarks/bench_learner.py --head [--tokens 8192 --vocab 151936]

The log-prob head alone, hidden states ``[N, D]`` and output weight ``[V, D]`` with grad ->
log-probs of the targets -> backward: the fused chunked head
(``gspo_rl.learner.model.logprob_head``) against the plain ``hidden @ W.T`` + float32
``log_softmax`` + gather (bf16 inputs on CUDA, float32 on the CPU): time ratio and peak memory (CUDA
``max_memory_allocated``; CPU the resident high-water mark in a fresh process) as multiples of the
float32 logits' bytes.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The learner (transformers with it) is imported where a trainer is made: ``--head`` and its
# fresh processes that measure peak memory need torch alone.
if TYPE_CHECKING:
    from gspo_rl.contract.schema import ReadyGroup
    from gspo_rl.learner.model.policy import Policy
    from gspo_rl.learner.trainer import Trainer

# hidden, layers, heads, kv heads, intermediate, vocab (Qwen2.5 configs; both tie embeddings)
SHAPES = {
    "tiny": (128, 2, 2, 2, 256, 1024),
    "0.5b": (896, 24, 14, 2, 4864, 151936),
    "1.5b": (1536, 28, 12, 2, 8960, 151936),
}
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0}
# issue 16's cases: shape, micro_batch_tokens
SUITE = (("0.5b", 16384), ("1.5b", 32768), ("0.5b", 65536))


@functools.cache
def naive_policy_cls() -> type[Policy]:
    """``NaivePolicy``, a ``Policy`` (made on first use: it imports the learner)."""
    from gspo_rl.learner.model.policy import Policy

    class NaivePolicy(Policy):
        """The baseline: full logits, float32 log-softmax over the vocabulary, then gather."""

        def token_logprobs(self, tokens_BT, attention_BT, temperature_B, mask_BT=None):
            tokens_BT, attention_BT = tokens_BT.to(self.device), attention_BT.to(self.device)
            t = temperature_B.to(self.device, torch.float32)[:, None, None]
            with self._autocast():
                logits = self.model(input_ids=tokens_BT[:, :-1],
                                    attention_mask=attention_BT[:, :-1]).logits
            lp = torch.log_softmax(logits.float() / t, dim=-1)
            lp = lp.gather(2, tokens_BT[:, 1:, None]).squeeze(-1)
            return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)

    return NaivePolicy


def make_groups(vocab: int, n: int, g: int, prompt: int, completion: int,
                seed: int = 0) -> list[ReadyGroup]:
    """Random tokens; completion lengths vary in [completion/2, completion]."""
    from gspo_rl.contract.schema import ReadyGroup, RolloutRecord
    from gspo_rl.learner.algorithm.losses import group_advantages

    rng = np.random.default_rng(seed)
    groups = []
    for k in range(n):
        p = rng.integers(0, vocab, prompt)
        rollouts = []
        for i in range(g):
            c = int(rng.integers(completion // 2, completion + 1))
            ids = np.r_[p, rng.integers(0, vocab, c)].astype(np.int32)
            mask = np.r_[np.zeros(prompt), np.ones(c)].astype(np.uint8)
            lps = np.where(mask > 0, -np.log(vocab), 0.0).astype(np.float32)
            rollouts.append(RolloutRecord(f"{k}-{i}", str(k), ids, mask, lps,
                                          np.where(mask > 0, 0, -1).astype(np.int32), prompt))
        rewards = rng.random(g).tolist()
        groups.append(ReadyGroup(str(k), rollouts, rewards, group_advantages(rewards).tolist(),
                                 [None] * g))
    return groups


def build_model(args, device: torch.device) -> torch.nn.Module:
    """A float32 model on ``device``: ``--model DIR`` or a random-init ``--shape``."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    if args.model:
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(device)
    h, layers, heads, kv, inter, vocab = SHAPES[args.shape]
    cfg = Qwen2Config(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                      tie_word_embeddings=True, max_position_embeddings=32768,
                      attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def make_trainer(naive: bool, args, device: torch.device) -> Trainer:
    from gspo_rl.learner.config import LearnerConfig
    from gspo_rl.learner.model.policy import Policy
    from gspo_rl.learner.trainer import Trainer

    model = build_model(args, device)
    ckpt = {"on": True, "off": False, "auto": None}[args.gradient_checkpointing]
    if naive:
        if ckpt is None:  # the same choice as ours, from the same rule
            from gspo_rl.learner.model.speed import needs_checkpointing

            ckpt = device.type == "cuda" and needs_checkpointing(
                model.config, sum(p.numel() for p in model.parameters()),
                args.micro_batch_tokens, True, torch.cuda.get_device_properties(
                    device).total_memory)
        policy: Policy = naive_policy_cls()(model, device, bf16_autocast=True)
        levers = {"param_dtype": "float32", "packing": "off", "gradient_checkpointing": ckpt,
                  "compile": "off"}
    else:
        policy = Policy(model, device)
        levers = {"gradient_checkpointing": ckpt, "compile": args.compile}
    cfg = LearnerConfig(model=args.model or args.shape, minibatches=args.minibatches, lr=1e-6,
                        micro_batch_tokens=args.micro_batch_tokens, loss={"kind": "gspo"},
                        old_logprobs=args.old_logprobs, **levers)
    trainer = Trainer(policy, cfg)
    if naive:  # the stock optimizer (foreach AdamW), not the fused one
        trainer.optimizer = torch.optim.AdamW(trainer.params, lr=cfg.lr)
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda k: 1.0)
    return trainer


def step_flops(model: torch.nn.Module, groups: list[ReadyGroup]) -> float:
    """Model FLOPs of one step (see the module doc)."""
    cfg = model.config
    head = model.get_output_embeddings().weight.numel()
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    n = sum(p.numel() for p in model.parameters())
    if not tied:
        n -= model.get_input_embeddings().weight.numel()
    lengths = np.array([len(r.token_ids) for g in groups for r in g.rollouts], dtype=np.float64)
    trained = sum(int(r.loss_mask.sum()) for g in groups for r in g.rollouts)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    d_attn = cfg.num_attention_heads * head_dim
    attn = 6.0 * cfg.num_hidden_layers * d_attn * float((lengths ** 2).sum())
    return 6.0 * (n - head) * lengths.sum() + 6.0 * head * trained + attn


def peak_flops(device: torch.device, override: float | None) -> float | None:
    if override is not None:
        return override * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v * 1e12 for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _timed_step(trainer: Trainer, groups) -> tuple[float, float]:
    """Seconds and tokens of one step (``Trainer.step`` synchronises at its end on CUDA)."""
    t0 = time.perf_counter()
    m = trainer.step(groups)
    return time.perf_counter() - t0, m["tokens"]


def _result(trainer: Trainer, secs: list[float], tokens: float, flops: float,
            peak_gib: float) -> dict[str, float | str]:
    s = statistics.median(secs)
    return {"tokens_s": tokens / s, "flops_s": flops / s, "peak_gib": peak_gib,
            "ckpt": str(trainer.speed.gradient_checkpointing)}


def measure_cuda(naive: bool, args, device: torch.device, groups) -> dict[str, float | str]:
    """One trainer alone on the GPU (its peak memory is its own): median over
    ``args.steps`` after a warm-up step (which also compiles)."""
    trainer = None
    try:
        trainer = make_trainer(naive, args, device)
        flops = step_flops(trainer.policy.model, groups)
        trainer.step(groups)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        runs = [_timed_step(trainer, groups) for _ in range(args.steps)]
        return _result(trainer, [r[0] for r in runs], runs[-1][1], flops,
                       torch.cuda.max_memory_allocated(device) / 2**30)
    except torch.OutOfMemoryError:
        return {"oom": "out of memory"}
    finally:
        del trainer
        gc.collect()
        torch.cuda.empty_cache()


def measure_cpu(args, device: torch.device, groups) -> dict[str, dict[str, float | str]]:
    """Both trainers at once, steps alternating, so that a shared, noisy CPU slows both
    alike (memory is not measured on the CPU)."""
    names = ["ours"] + ([] if args.skip_baseline else ["baseline"])
    trainers = {n: make_trainer(n == "baseline", args, device) for n in names}
    flops = step_flops(trainers["ours"].policy.model, groups)
    secs: dict[str, list[float]] = {n: [] for n in names}
    tokens = 0.0
    for t in trainers.values():
        t.step(groups)  # warm-up
    for _ in range(args.steps):
        for n, t in trainers.items():
            sec, tokens = _timed_step(t, groups)
            secs[n].append(sec)
    return {n: _result(t, secs[n], tokens, flops, float("nan")) for n, t in trainers.items()}


def run_case(args, device: torch.device) -> None:
    vocab = SHAPES[args.shape][5] if not args.model else int(
        __import__("transformers").AutoConfig.from_pretrained(args.model).vocab_size)
    groups = make_groups(vocab, args.groups, args.group_size, args.prompt, args.completion)
    n_tok = sum(len(r.token_ids) for g in groups for r in g.rollouts)
    peak = peak_flops(device, args.peak_tflops)
    print(f"\n{args.model or args.shape}: {args.groups}x{args.group_size} rollouts, {n_tok} "
          f"tokens per step, {args.minibatches} minibatches, micro_batch_tokens "
          f"{args.micro_batch_tokens}, {device} "
          f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'})")
    if device.type == "cuda":
        rows = {"ours": measure_cuda(False, args, device, groups)}
        if not args.skip_baseline:
            rows["baseline"] = measure_cuda(True, args, device, groups)
    else:
        rows = measure_cpu(args, device, groups)
    for name, r in rows.items():
        if "oom" in r:
            print(f"{name:9s} out of memory")
            continue
        mfu = f"MFU {100 * r['flops_s'] / peak:5.1f}%" if peak else "MFU n/a"
        mem = f"{r['peak_gib']:6.1f} GiB" if device.type == "cuda" else "n/a"
        print(f"{name:9s} {r['tokens_s']:10.0f} tokens/s   {mfu}   peak {mem}   "
              f"checkpointing {r['ckpt']}")
    ours, base = rows["ours"], rows.get("baseline", {})
    if "tokens_s" in ours and "tokens_s" in base:
        print(f"throughput ratio ours/baseline: {ours['tokens_s'] / base['tokens_s']:.2f} "
              f"(goal >= 1.5 on CUDA)")
        if device.type == "cuda":
            print(f"peak memory ratio ours/baseline: {ours['peak_gib'] / base['peak_gib']:.2f} "
                  f"(goal <= 1.0)")


# ---------------------------------------------------------------- the head alone

def head_inputs(n: int, v: int, d: int, device: str):
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    h = torch.randn(n, d, generator=g).to(device, dtype)
    w = (torch.randn(v, d, generator=g) * d ** -0.5).to(device, dtype)
    return h, w, torch.randint(0, v, (n,), generator=g).to(device)


def head_once(impl: str, h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> None:
    """Forward + backward of the log-prob head alone."""
    from gspo_rl.learner.model.logprob_head import fused_logprobs

    h, w = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
    t_N = torch.full((h.shape[0],), 0.7, device=h.device)
    if impl == "fused":
        lp = fused_logprobs(h, w, targets, temperature_N=t_N)
    else:
        lp = torch.log_softmax((h @ w.T).float() / t_N[:, None], -1).gather(1, targets[:, None])
    lp.sum().backward()


_HEAD_PEAK = """
import sys
sys.path.insert(0, {root!r})
from benchmarks.bench_learner import head_inputs, head_once

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

head_once({impl!r}, *head_inputs(8, 64, 16, "cpu"))
args = head_inputs({n}, {v}, {d}, "cpu")
open("/proc/self/clear_refs", "w").write("5")  # reset the resident high-water mark
base = status("VmRSS:")
head_once({impl!r}, *args)
print(status("VmHWM:") - base)
"""


def head_peak(impl: str, n: int, v: int, d: int, device: str) -> float:
    """Peak extra bytes of one head forward+backward."""
    if device.startswith("cuda"):
        args = head_inputs(n, v, d, device)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        head_once(impl, *args)
        return float(torch.cuda.max_memory_allocated() - base)
    code = _HEAD_PEAK.format(root=str(Path(__file__).resolve().parents[1]), impl=impl, n=n,
                             v=v, d=d)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench_head(args, device: str) -> None:
    x = head_inputs(args.tokens, args.vocab, args.hidden, device)
    times: dict[str, list[float]] = {"fused": [], "plain": []}
    for impl in times:
        head_once(impl, *x)  # warm-up
    for _ in range(args.steps):
        for impl in times:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            head_once(impl, *x)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times[impl].append(time.perf_counter() - t0)
    logits_bytes = args.tokens * args.vocab * 4
    peaks = {impl: head_peak(impl, args.tokens, args.vocab, args.hidden, device)
             for impl in times}
    print(f"log-prob head: N={args.tokens} tokens, D={args.hidden}, V={args.vocab}, "
          f"{x[0].dtype}, {device}")
    for impl in times:
        print(f"{impl:6s} {statistics.median(times[impl]) * 1e3:8.1f} ms   "
              f"peak {peaks[impl] / logits_bytes:5.2f}x float32 logits")
    print(f"time ratio fused/plain: "
          f"{statistics.median(times['fused']) / statistics.median(times['plain']):.2f}; "
          f"peak ratio: {peaks['fused'] / peaks['plain']:.2f} (goals <= 1.0)")


def add_step_args(ap: argparse.ArgumentParser) -> None:
    """The batch and the trainer's levers (shared with ``profile_learner.py``)."""
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--completion", type=int, default=768)
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--gradient-checkpointing", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                    help="torch.compile decoder layers (auto: the learner's default)")
    ap.add_argument("--old-logprobs", choices=("behavior", "recompute"), default="behavior",
                    help="recompute: one more forward pass per step for pi_old, as the GPU "
                         "compose profiles configure it (the baseline does the same)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="random-init model shape (default: 0.5b on CUDA, tiny on the CPU)")
    ap.add_argument("--model", default=None, help="a Hugging Face model directory instead")
    ap.add_argument("--suite", action="store_true", help="issue 16's three CUDA cases")
    add_step_args(ap)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--head", action="store_true", help="benchmark the log-prob head alone")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=896)
    args = ap.parse_args()
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    if args.head:
        bench_head(args, str(device))
        return
    if args.shape is None:
        args.shape = "0.5b" if device.type == "cuda" else "tiny"
    cases = SUITE if args.suite else ((args.shape, args.micro_batch_tokens),)
    for shape, micro in cases:
        args.shape, args.micro_batch_tokens = shape, micro
        run_case(args, device)


if __name__ == "__main__":
    main()
