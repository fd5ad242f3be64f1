"""What a new shape costs the hf engine's masked attention, per SDPA backend (a GPU probe).

    python benchmarks/probe_sdpa_shapes.py --device cuda [--shapes 20 --steps 64]

Why: under continuous batching the engine's attention has a padding mask and a new shape at
nearly every step (the cache grows by a column; rows join and leave). cuDNN attention builds
an execution graph, on the CPU, for every shape it has not seen. PyTorch 2.11 picks it for
masked bfloat16 attention on an H100, and the server then ran several times slower than its
engine until the shapes repeated (BENCHMARKS.md, "On an H100"). The engine's steps now run
without it (``gspo_rl.server.engines.hf.attention.step_backends``).

Three measurements, each "PyTorch's choice" (baseline) against the engine's step backends, in
the same run:

1. One masked decode-shaped attention call (32 rows, 4 heads, 1 query, head dim 64), at
   ``--shapes`` cache lengths never seen before: first call (a new shape) and a repeat call.
2. A training shape (bf16 only): a masked forward + backward at new lengths, as the
   learner's padded microbatches (``gspo_rl.learner.model.policy``) meet them (lengths from 1,000;
   64 on the CPU).
3. The engine's own path (``RunningKV``: prefill then ``--steps`` decode steps of the tiny
   model, a batch size not seen before): ms per step; then the same run again, every shape
   seen (what is left of a new shape's cost with the engine's backends is the difference).

Prints which backend PyTorch picks for masked attention in each dtype, the times, and the
ratio of a new shape's cost, PyTorch's choice / the engine's. On the CPU the two are the same
backends (a check that the probe runs; the ratio is ~1).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gspo_rl.server.engines.hf import attention as hf_attention  # noqa: E402
from gspo_rl.server.engines.hf.running import RunningKV  # noqa: E402

WAYS = ("pytorch_choice", "engine_steps")


def backends(way: str, dev: torch.device) -> contextlib.AbstractContextManager[object]:
    return hf_attention.step_backends(dev) if way == "engine_steps" else contextlib.nullcontext()


def timed(fn: Callable[[], object], dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    start = time.perf_counter()
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - start


def qkvm(length: int, dtype: torch.dtype, dev: torch.device) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device=dev).manual_seed(length)
    q = torch.randn(32, 4, 1, 64, device=dev, dtype=dtype, generator=gen)
    k = torch.randn(32, 4, length, 64, device=dev, dtype=dtype, generator=gen)
    v = torch.randn(32, 4, length, 64, device=dev, dtype=dtype, generator=gen)
    mask = torch.ones(32, 1, 1, length, dtype=torch.bool, device=dev)
    mask[::2, :, :, :3] = False  # left padding in half the rows
    return q, k, v, mask


def attention_calls(dtype: torch.dtype, dev: torch.device, shapes: int) -> dict[str, float]:
    """Mean ms of a first (new shape) and a repeat masked call, each way; fresh lengths."""
    out: dict[str, float] = {}
    base = 100 if dtype == torch.bfloat16 else 100 + 4 * shapes
    for i, way in enumerate(WAYS):
        firsts, repeats = [], []
        for length in range(base + 2 * i * shapes, base + (2 * i + 1) * shapes):
            q, k, v, mask = qkvm(length, dtype, dev)

            def call(q=q, k=k, v=v, mask=mask) -> torch.Tensor:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

            with backends(way, dev), torch.inference_mode():
                firsts.append(timed(call, dev))
                repeats.append(timed(call, dev))
        out[f"{way} new"] = 1e3 * statistics.mean(firsts)
        out[f"{way} repeat"] = 1e3 * statistics.mean(repeats)
    return out


def engine_steps(model: torch.nn.Module, dev: torch.device, steps: int,
                 batch: int) -> float:
    """ms per step of a prefill and ``steps`` decode steps of ``batch`` rows."""
    kv = RunningKV(model, 0, dev)
    prompts = [[5 + j % 7] * (24 + j % 9) for j in range(batch)]

    def run() -> None:
        kv.prefill(prompts, merge=False)
        for _ in range(steps):
            kv.decode()

    return 1e3 * timed(run, dev) / (steps + 1)


def training_calls(dev: torch.device, lengths: int, base: int) -> dict[str, float]:
    """Mean ms of a masked bf16 attention forward + backward at a training shape (a padded
    microbatch: 4 rows, 14 heads, head dim 64, causal with left padding), at new lengths
    (the learner's padded forward, ``gspo_rl.learner.model.policy.Policy._attention``), each way."""
    out: dict[str, float] = {}
    for i, way in enumerate(WAYS):
        times = []
        first = base + 37 * i * lengths
        for length in [base - 1, *range(first, first + 37 * lengths, 37)]:
            gen = torch.Generator(device=dev).manual_seed(length)
            q, k, v = (torch.randn(4, 14, length, 64, device=dev, dtype=torch.bfloat16,
                                   generator=gen, requires_grad=True) for _ in range(3))
            mask = torch.ones(length, length, device=dev, dtype=torch.bool).tril()
            mask = mask.expand(4, 1, length, length).clone()
            mask[1:, :, :, :50] = False  # left padding in three rows
            mask[1:, :, :50, :50] |= torch.eye(50, device=dev, dtype=torch.bool)  # no empty row

            def step(q=q, k=k, v=v, mask=mask) -> None:
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()

            with backends(way, dev):
                times.append(timed(step, dev))
        out[way] = 1e3 * statistics.mean(times[1:])  # the first: libraries' start-up
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shapes", type=int, default=20, help="new cache lengths per way")
    p.add_argument("--steps", type=int, default=64, help="decode steps per engine run")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    args = p.parse_args()
    dev = torch.device(args.device)
    print(f"torch {torch.__version__}, device {dev}"
          + (f" ({torch.cuda.get_device_name(dev)}, cuDNN {torch.backends.cudnn.version()})"
             if dev.type == "cuda" else ""))
    from transformers import AutoModelForCausalLM

    from gspo_rl.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_model(Path(tmp) / "tiny", num_layers=args.layers,
                               hidden_size=args.hidden)
        for n, dtype in enumerate((torch.bfloat16, torch.float32)):
            q, k, v, mask = qkvm(40, dtype, dev)
            for way in WAYS:
                with backends(way, dev):
                    choice = SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, False))
                print(f"{dtype}: masked attention, {way}: {choice.name}")
            if dtype == torch.bfloat16:
                train = training_calls(dev, max(2, args.shapes // 4),
                                       1000 if dev.type == "cuda" else 64)
                print(f"{dtype}: training shape, forward + backward at a new length: "
                      + ", ".join(f"{way} {ms:.2f} ms" for way, ms in train.items())
                      + f"; ratio {train['pytorch_choice'] / train['engine_steps']:.2f}")
            calls = attention_calls(dtype, dev, args.shapes)
            for way in WAYS:
                print(f"{dtype}: one call, {way}: new shape {calls[f'{way} new']:.3f} ms, "
                      f"repeat {calls[f'{way} repeat']:.3f} ms")
            print(f"{dtype}: ratio of a new shape's cost, pytorch_choice / engine_steps: "
                  f"{calls['pytorch_choice new'] / calls['engine_steps new']:.2f}")
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=hf_attention.register()).to(dev).eval()
            new, seen = {}, {}
            for i, way in enumerate(WAYS):  # a batch size not run before, each way, then again
                with backends(way, dev), torch.inference_mode():
                    new[way] = engine_steps(model, dev, args.steps, 21 + 2 * i + 10 * n)
                    seen[way] = engine_steps(model, dev, args.steps, 21 + 2 * i + 10 * n)
            print(f"{dtype}: engine, ms per step at new shapes: "
                  + ", ".join(f"{way} {ms:.2f}" for way, ms in new.items())
                  + f"; ratio {new['pytorch_choice'] / new['engine_steps']:.2f}")
            print(f"{dtype}: engine, ms per step at the same shapes again: "
                  + ", ".join(f"{way} {ms:.2f}" for way, ms in seen.items())
                  + f"; ratio {seen['pytorch_choice'] / seen['engine_steps']:.2f}")


if __name__ == "__main__":
    main()
