"""Learner throughput: ``Trainer.step`` tokens/s, ours against a plain log-softmax baseline.

    .venv/bin/python benchmarks/bench_learner.py [--model DIR] [--groups 8 --group-size 8
        --prompt 64 --completion 192 --steps 3 --minibatches 2 --device auto]

Ours: ``Policy.token_logprobs`` (logits only from the first trained position on, the chunked
selected-logprob kernel). Baseline, same run, same data: full ``[B, T, V]`` logits and
``log_softmax(logits.float() / t).gather(..)`` (the usual transcription). Prints tokens/s of
each, their ratio (goal >= 1.0) and, on CUDA, the peak memory of a step (goal <= 1.0x).
Without ``--model`` a tiny model is made in a temporary directory (``server.tiny_model``).

    .venv/bin/python benchmarks/bench_learner.py --head [--tokens 2048 --vocab 32768]

The log-prob head alone (``[N, V]`` logits with grad -> log-probs of the targets ->
backward), where the vocabulary is realistic: time ratio ours/baseline and, on CPU, the
resident high-water mark of one forward+backward above the logits, in a fresh process per
implementation (on CUDA ``max_memory_allocated``), as a multiple of the logits' bytes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.config import LearnerConfig  # noqa: E402
from learner.losses import group_advantages  # noqa: E402
from learner.policy import Policy, selected_logprobs  # noqa: E402
from learner.trainer import Trainer  # noqa: E402
from server.redis_schema import ReadyGroup, RolloutRecord  # noqa: E402


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


def make_groups(vocab: int, n: int, g: int, prompt: int, completion: int,
                seed: int = 0) -> list[ReadyGroup]:
    """Random tokens; completion lengths vary in [completion/2, completion]."""
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


def make_trainer(policy_cls: type[Policy], model_dir: str, args) -> Trainer:
    policy = policy_cls.load(model_dir, device=args.device)
    cfg = LearnerConfig(model=model_dir, minibatches=args.minibatches, lr=1e-6,
                        micro_batch_tokens=args.micro_batch_tokens, loss={"kind": "grpo"})
    return Trainer(policy, cfg)


def measure(trainers: list[Trainer], groups, steps: int) -> list[tuple[float, float]]:
    """Median tokens/s and peak MiB (CUDA; NaN on CPU) of each trainer. Steps alternate
    between the trainers so that a noisy machine slows both alike."""
    for t in trainers:
        t.step(groups)  # warm-up
    rates: list[list[float]] = [[] for _ in trainers]
    peaks = [float("nan")] * len(trainers)
    for _ in range(steps):
        for i, t in enumerate(trainers):
            cuda = t.policy.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(t.policy.device)
            t0 = time.perf_counter()
            m = t.step(groups)
            rates[i].append(m["tokens"] / (time.perf_counter() - t0))
            if cuda:
                peaks[i] = max(peaks[i] if peaks[i] == peaks[i] else 0.0,
                               torch.cuda.max_memory_allocated(t.policy.device) / 2**20)
    return [(statistics.median(r), p) for r, p in zip(rates, peaks, strict=True)]


def head_once(impl: str, logits_NV: torch.Tensor, targets_N: torch.Tensor) -> None:
    """Forward + backward of the log-prob head alone."""
    x = logits_NV.detach().requires_grad_(True)
    t_N = torch.full((x.shape[0],), 0.7, device=x.device)
    if impl == "ours":
        lp = selected_logprobs(x[None], targets_N[None], t_N[:1])[0]
    else:
        lp = torch.log_softmax(x.float() / t_N[:, None], -1).gather(1, targets_N[:, None])
    lp.sum().backward()


def head_inputs(n: int, v: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, v, generator=g).to(device),
            torch.randint(0, v, (n,), generator=g).to(device))


_HEAD_PEAK = """
import sys
sys.path.insert(0, {root!r})
from benchmarks.bench_learner import head_inputs, head_once

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

head_once({impl!r}, *head_inputs(8, 64, "cpu"))
x, t = head_inputs({n}, {v}, "cpu")
open("/proc/self/clear_refs", "w").write("5")  # reset the resident high-water mark
base = status("VmRSS:")
head_once({impl!r}, x, t)
print(status("VmHWM:") - base)
"""


def head_peak(impl: str, n: int, v: int, device: str) -> float:
    """Peak extra bytes of one head forward+backward."""
    if device.startswith("cuda"):
        x, t = head_inputs(n, v, device)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        head_once(impl, x, t)
        return float(torch.cuda.max_memory_allocated() - base)
    code = _HEAD_PEAK.format(root=str(Path(__file__).resolve().parents[1]), impl=impl, n=n, v=v)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench_head(args) -> None:
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else (
        "cpu" if args.device == "auto" else args.device)
    x, t = head_inputs(args.tokens, args.vocab, device)
    times: dict[str, list[float]] = {"ours": [], "baseline": []}
    for impl in times:
        head_once(impl, x, t)  # warm-up
    for _ in range(args.steps):
        for impl in times:
            t0 = time.perf_counter()
            head_once(impl, x, t)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times[impl].append(time.perf_counter() - t0)
    logits_bytes = x.numel() * x.element_size()
    peaks = {impl: head_peak(impl, args.tokens, args.vocab, device) for impl in times}
    print(f"log-prob head: N={args.tokens} tokens, V={args.vocab}, float32, {device}")
    for impl in times:
        print(f"{impl:9s} {statistics.median(times[impl]) * 1e3:8.1f} ms   "
              f"peak {peaks[impl] / logits_bytes:5.2f}x logits")
    print(f"time ratio ours/baseline: "
          f"{statistics.median(times['ours']) / statistics.median(times['baseline']):.2f}; "
          f"peak ratio: {peaks['ours'] / peaks['baseline']:.2f} (goals <= 1.0)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=192)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--head", action="store_true", help="benchmark the log-prob head alone")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32768)
    args = ap.parse_args()
    if args.head:
        bench_head(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from server.tiny_model import make_tiny_model

            model_dir = str(make_tiny_model(Path(tmp) / "tiny"))
        from transformers import AutoConfig

        vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
        groups = make_groups(vocab, args.groups, args.group_size, args.prompt, args.completion)
        trainers = [make_trainer(Policy, model_dir, args),
                    make_trainer(NaivePolicy, model_dir, args)]
        (ours, ours_peak), (base, base_peak) = measure(trainers, groups, args.steps)
    n_tok = sum(len(r.token_ids) for g in groups for r in g.rollouts)
    print(f"model {model_dir if args.model else 'tiny (2 layers, 128 hidden, vocab 1024)'}; "
          f"{args.groups}x{args.group_size} rollouts, {n_tok} tokens per step, "
          f"{args.minibatches} minibatches, device {args.device}")
    print(f"ours     {ours:10.0f} tokens/s   peak {ours_peak:8.1f} MiB")
    print(f"baseline {base:10.0f} tokens/s   peak {base_peak:8.1f} MiB")
    print(f"throughput ratio ours/baseline: {ours / base:.2f} (goal >= 1.0)")
    if ours_peak == ours_peak:  # not NaN: CUDA
        print(f"peak memory ratio ours/baseline: {ours_peak / base_peak:.2f} (goal <= 1.0)")


if __name__ == "__main__":
    main()
