"""Where a learner step's GPU time goes: one ``Trainer.step`` under ``torch.profiler``.

    python benchmarks/profile_learner.py [--shape 0.5b --micro-batch-tokens 16384 --naive]

Builds the trainer exactly as ``bench_learner.py`` does (ours, or ``--naive`` for its
baseline), runs a warm-up step, profiles the next one and prints the operators with the most
self device time, plus the share of the step that matrix multiplies, copies, attention and
elementwise kernels take (on a machine without CUDA, or ``--device cpu``: operators' self CPU
time instead). ``--trace FILE`` also writes a Chrome trace.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_learner import (  # noqa: E402
    SHAPES,
    add_step_args,
    make_groups,
    make_trainer,
)

# Kernel-name fragments -> category (first match wins; lower-case).
CATEGORIES = (("attention", ("flash", "attention", "fmha", "sdpa", "flex")),
              ("matmul", ("gemm", "sm90_xmma", "cutlass", "nvjet", "cublas", "matmul", "::mm",
                         "addmm", "bmm")),
              ("copy/cast", ("copy", "cast", "to_copy", "memcpy", "memset")),
              ("softmax", ("softmax", "logsumexp")),
              ("optimizer", ("adam", "multi_tensor", "foreach")),
              ("reduce", ("reduce", "norm")))


def category(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in CATEGORIES if any(k in low for k in keys)), "elementwise/other")


def _shares(prof: profile, cuda: bool) -> dict[str, float]:
    """Microseconds per category: GPU kernels on CUDA, operators' self CPU time on the CPU."""
    shares: dict[str, float] = defaultdict(float)
    if not cuda:
        for ev in prof.key_averages():
            if ev.key.startswith("aten::"):
                shares[category(ev.key)] += ev.self_cpu_time_total
        return shares
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            shares[category(ev.name)] += ev.device_time if hasattr(ev, "device_time") \
                else ev.cuda_time
    return shares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--model", default=None)
    ap.add_argument("--naive", action="store_true", help="profile the naive baseline instead")
    add_step_args(ap)
    ap.add_argument("--rows", type=int, default=30)
    ap.add_argument("--trace", default=None, help="write a Chrome trace here")
    ap.add_argument("--device", default="auto", help="auto: CUDA when available, else cpu")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    groups = make_groups(SHAPES[args.shape][5], args.groups, args.group_size, args.prompt,
                         args.completion)
    trainer = make_trainer(args.naive, args, device)
    trainer.step(groups)  # warm-up (and compilation)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        m = trainer.step(groups)  # synchronises with the GPU at its end
    print(f"{'naive' if args.naive else 'ours'} {args.shape} on {device}: step "
          f"{m['compute_s']:.3f} s, {m['tokens_per_s']:.0f} tokens/s, plan {trainer.speed}")
    events = prof.key_averages()
    key = ("self_device_time_total" if hasattr(events[0], "self_device_time_total")
           else "self_cuda_time_total") if cuda else "self_cpu_time_total"
    print(events.table(sort_by=key, row_limit=args.rows, max_name_column_width=60))
    shares = _shares(prof, cuda)
    total = sum(shares.values()) or 1.0
    what = "kernel" if cuda else "operator (self CPU)"
    print(f"{what} time {total / 1e6:.3f} s (step wall {m['compute_s']:.3f} s); by category:")
    for c, t in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {c:18s} {100 * t / total:5.1f}%  {t / 1e3:9.1f} ms")
    if args.trace:
        prof.export_chrome_trace(args.trace)


if __name__ == "__main__":
    main()
