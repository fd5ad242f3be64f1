"""Forward + backward of each loss kind against a straightforward reference, in one run.

    .venv/bin/python benchmarks/bench_losses.py [--B 256 --T 4096 --repeats 5]

Prints, per kind, the time ratio (ours / reference; goal <= 1.0) and the peak extra memory of
forward + backward as a multiple of the size of the ``[B, T]`` inputs (goal <= 3x). On CPU the
peak is the process's resident high-water mark above the inputs, measured in a fresh subprocess
per (implementation, kind); on CUDA it is ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gspo_rl.learner.algorithm.config import LossConfig  # noqa: E402
from gspo_rl.learner.algorithm.losses import policy_loss  # noqa: E402

KINDS = ["gspo", "gspo_token", "grpo", "sapo"]



def reference_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """A line-by-line autograd transcription of ../shared/GSPO.md (also the tests' oracle)."""
    keep = mask > 0
    lp = torch.where(keep, logprobs, torch.zeros_like(logprobs))
    old = torch.where(keep, old_logprobs, torch.zeros_like(old_logprobs))
    log_ratio = (lp - old).clamp(-cfg.max_log_ratio, cfg.max_log_ratio) * keep
    lengths = keep.sum(-1)
    valid = lengths > 0
    denom = lengths.clamp(min=1)
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
    adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(lp)
    if cfg.kind == "gspo":
        s = torch.exp(log_ratio.sum(-1) / denom)
        a = advantages
        per_seq = torch.minimum(s * a, torch.clamp(s, lo, hi) * a)
    elif cfg.kind == "gspo_token":
        s = torch.exp(log_ratio.sum(-1) / denom)
        # s_it = sg(s_i) * pi / sg(pi), written on the clamped log-ratio
        s_tok = s.detach()[:, None] * torch.exp(log_ratio - log_ratio.detach())
        obj = torch.minimum(s_tok * adv, torch.clamp(s_tok, lo, hi) * adv)
        per_seq = (obj * keep).sum(-1) / denom
    elif cfg.kind == "grpo":
        w = torch.exp(log_ratio)
        obj = torch.minimum(w * adv, torch.clamp(w, lo, hi) * adv)
        per_seq = (obj * keep).sum(-1) / denom
    else:  # sapo
        r = torch.exp(log_ratio)
        tau = torch.where(adv > 0, torch.full_like(adv, cfg.tau_pos),
                          torch.full_like(adv, cfg.tau_neg))
        obj = torch.sigmoid(tau * (r - 1)) * 4 / tau * adv
        per_seq = (obj * keep).sum(-1) / denom
    if is_weights is not None:
        per_seq = per_seq * is_weights.detach()
    return -(per_seq * valid).sum() / valid.sum().clamp(min=1)


def make_inputs(B: int, T: int, kind: str, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    lp = old + torch.randn(B, T, generator=g) * 1e-3
    lengths = torch.randint(T // 8, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    adv = torch.randn(B, generator=g)
    if kind != "gspo":
        adv = adv[:, None] * (1 + 0.1 * torch.rand(B, T, generator=g))
    out = {"logprobs": lp, "old_logprobs": old, "advantages": adv, "mask": mask}
    return {k: v.to(device) for k, v in out.items()}


def run_once(impl: str, kind: str, x: dict[str, torch.Tensor]) -> None:
    cfg = LossConfig(kind=kind)
    lp = x["logprobs"].detach().requires_grad_(True)
    if impl == "ours":
        loss = policy_loss(lp, x["old_logprobs"], x["advantages"], x["mask"], cfg).loss
    else:
        loss = reference_loss(lp, x["old_logprobs"], x["advantages"], x["mask"], cfg)
    loss.backward()
    if lp.is_cuda:
        torch.cuda.synchronize()


def time_pair(kind: str, x: dict[str, torch.Tensor], repeats: int) -> tuple[float, float]:
    """Median seconds of ours and of the reference, interleaved so that noise hits both."""
    times: dict[str, list[float]] = {"ours": [], "ref": []}
    for _ in range(3):  # warm-up: the first runs pay for page faults of fresh allocations
        for impl in times:
            run_once(impl, kind, x)
    for _ in range(repeats):
        for impl, acc in times.items():
            t0 = time.perf_counter()
            run_once(impl, kind, x)
            acc.append(time.perf_counter() - t0)
    return statistics.median(times["ours"]), statistics.median(times["ref"])


def input_bytes(x: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() * v.element_size() for v in x.values() if v.dim() == 2)


_PEAK_PROBE = """
import sys, torch
sys.path.insert(0, {root!r})
from benchmarks.bench_losses import make_inputs, run_once

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

x = make_inputs({B}, {T}, {kind!r}, "cpu")
run_once({impl!r}, {kind!r}, make_inputs(8, 64, {kind!r}, "cpu"))
open("/proc/self/clear_refs", "w").write("5")  # reset the resident high-water mark
base = status("VmRSS:")
run_once({impl!r}, {kind!r}, x)
print(status("VmHWM:") - base)
"""


def peak_extra_cpu(impl: str, kind: str, B: int, T: int) -> int:
    """Resident high-water mark of one forward+backward above the inputs, in a fresh process."""
    code = _PEAK_PROBE.format(root=str(Path(__file__).resolve().parents[1]), B=B, T=T,
                              kind=kind, impl=impl)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def peak_extra_cuda(impl: str, kind: str, x: dict[str, torch.Tensor]) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run_once(impl, kind, x)
    return torch.cuda.max_memory_allocated() - base


def peaks_cpu(B: int, T: int, kinds: list[str]) -> dict[tuple[str, str], int]:
    """``peak_extra_cpu`` of every (impl, kind), each in its own process, as many at once as
    there are cores (after the timings: they would disturb them)."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(impl, kind) for kind in kinds for impl in ("ours", "ref")]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        peaks = pool.map(lambda job: peak_extra_cpu(job[0], job[1], B, T), jobs)
        return dict(zip(jobs, peaks, strict=True))


def bench_device(device: str, B: int, T: int, repeats: int,
                 kinds: list[str]) -> list[dict[str, object]]:
    rows = []
    times = {}
    for kind in kinds:
        times[kind] = time_pair(kind, make_inputs(B, T, kind, device), repeats)
    peaks = peaks_cpu(B, T, kinds) if device == "cpu" else {}
    for kind in kinds:
        x = make_inputs(B, T, kind, device)
        t_ours, t_ref = times[kind]
        if device == "cpu":
            m_ours, m_ref = peaks["ours", kind], peaks["ref", kind]
        else:
            m_ours, m_ref = (peak_extra_cuda(i, kind, x) for i in ("ours", "ref"))
        nbytes = input_bytes(x)
        rows.append({
            "device": device, "kind": kind, "ours_ms": 1e3 * t_ours, "ref_ms": 1e3 * t_ref,
            "time_ratio": t_ours / t_ref, "ours_peak_x_inputs": m_ours / nbytes,
            "ref_peak_x_inputs": m_ref / nbytes, "inputs_mib": nbytes / 2**20,
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=256)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", action="store_true", help="print one JSON object per row")
    ap.add_argument("--kinds", default=",".join(KINDS), help="the losses, comma-separated")
    ap.add_argument("--device", choices=("all", "cpu", "cuda"), default="all",
                    help="all: the CPU, and CUDA when available")
    args = ap.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.device != "all":
        devices = [args.device]
    print(f"B={args.B} T={args.T} torch={torch.__version__} threads={torch.get_num_threads()}")
    hdr = (f"{'device':6} {'kind':10} {'ours ms':>9} {'ref ms':>9} {'time ratio':>10} "
           f"{'ours peak/in':>12} {'ref peak/in':>11}")
    print(hdr)
    for device in devices:
        for r in bench_device(device, args.B, args.T, args.repeats, args.kinds.split(",")):
            if args.json:
                print(json.dumps(r))
                continue
            print(f"{r['device']:6} {r['kind']:10} {r['ours_ms']:9.1f} {r['ref_ms']:9.1f} "
                  f"{r['time_ratio']:10.2f} {r['ours_peak_x_inputs']:12.2f} "
                  f"{r['ref_peak_x_inputs']:11.2f}")
    print("goal: time ratio <= 1.0, ours peak/in <= 3.0 "
          "(peak extra memory over the bytes of the [B, T] inputs)")


if __name__ == "__main__":
    main()
