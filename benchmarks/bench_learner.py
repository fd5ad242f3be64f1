"""Learner throughput: ``Trainer.step`` tokens/s, ours against a plain log-softmax baseline.

    .venv/bin/python benchmarks/bench_learner.py [--model DIR] [--groups 8 --group-size 8
        --prompt 64 --completion 192 --steps 3 --minibatches 2 --device auto]

Ours: ``Policy.token_logprobs`` (logits only from the first trained position on, the chunked
selected-logprob kernel). Baseline, same run, same data: full ``[B, T, V]`` logits and
``log_softmax(logits.float() / t).gather(..)`` (the usual transcription). Prints tokens/s of
each, their ratio (goal >= 1.0) and, on CUDA, the peak memory of a step (goal <= 1.0x).
Without ``--model`` a tiny model is made in a temporary directory (``server.tiny_model``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.config import LearnerConfig  # noqa: E402
from learner.losses import group_advantages  # noqa: E402
from learner.policy import Policy  # noqa: E402
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


def measure(policy_cls: type[Policy], model_dir: str, groups, args) -> tuple[float, float]:
    policy = policy_cls.load(model_dir, device=args.device)
    cfg = LearnerConfig(model=model_dir, minibatches=args.minibatches, lr=1e-6,
                        micro_batch_tokens=args.micro_batch_tokens, loss={"kind": "grpo"})
    trainer = Trainer(policy, cfg)
    trainer.step(groups)  # warm-up
    cuda = policy.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(policy.device)
    rates = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        m = trainer.step(groups)
        rates.append(m["tokens"] / (time.perf_counter() - t0))
    peak = torch.cuda.max_memory_allocated(policy.device) / 2**20 if cuda else float("nan")
    return statistics.median(rates), peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--completion", type=int, default=192)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from server.tiny_model import make_tiny_model

            model_dir = str(make_tiny_model(Path(tmp) / "tiny"))
        from transformers import AutoConfig

        vocab = int(AutoConfig.from_pretrained(model_dir).vocab_size)
        groups = make_groups(vocab, args.groups, args.group_size, args.prompt, args.completion)
        ours, ours_peak = measure(Policy, model_dir, groups, args)
        base, base_peak = measure(NaivePolicy, model_dir, groups, args)
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
