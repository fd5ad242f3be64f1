"""Conversions between the ``Engine`` interface's types and vLLM's, and the weight-name checks
of ``gspo_rl.server.engines.vllm.engine``: pure functions (vLLM is imported lazily, inside them), so
the rules are testable and the engine module stays about the engine.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gspo_rl.server.engines.base import SamplingParams

STREAM_INTERVAL = 16  # tokens per streamed chunk of one request (after its first token)


def vllm_params(p: SamplingParams) -> Any:
    """vLLM's sampling parameters for ours: no implicit EOS (only ``stop_token_ids`` end on a
    token, as in the hf engine), text only when stop strings need it (special tokens kept, as
    the hf engine decodes them), streamed as deltas so progress is visible: the first token,
    then every ``STREAM_INTERVAL`` tokens, then the rest (an output per token per request
    costs the server process CPU on every engine step; vLLM's own server asks for the final
    output only when not streaming)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        n=1, max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
        top_k=p.top_k, seed=p.seed, stop=list(p.stop) or None,
        stop_token_ids=list(p.stop_token_ids), ignore_eos=True, logprobs=p.top_logprobs,
        detokenize=bool(p.stop), skip_special_tokens=False,
        output_kind=RequestOutputKind.DELTA, stream_interval=STREAM_INTERVAL)


def take_delta(out: Any, k: int, ids: list[int], lps: list[float],
               tops: list[list[tuple[int, float]]]) -> None:
    """Append one streamed chunk: its new tokens, their log-probabilities, their top-k."""
    steps = out.logprobs or []
    for tok, step in zip(out.token_ids, steps, strict=True):
        ids.append(int(tok))
        lps.append(float(step[tok].logprob))
        if k > 0:
            ranked = sorted((lp.rank, t, lp.logprob) for t, lp in step.items()
                            if lp.rank is not None and lp.rank <= k
                            and lp.logprob > float("-inf"))  # not cut by top-k / top-p
            tops.append([(int(t), float(v)) for _, t, v in ranked[:k]])


def versions_per_token(spans: Any, n: int, current: int) -> list[int]:
    """vLLM's weight-version spans (labels are our integer versions) as one int per token."""
    if not spans:
        return [current] * n
    out = [current] * n
    for span in spans:
        out[span.start:span.end] = [int(span.version)] * (span.end - span.start)
    return out[:n]


def fused_siblings(name: str, packed: dict[str, list[str]]) -> list[str]:
    """Other HF names stored in the same vLLM tensor as ``name`` (e.g. q_proj -> k_proj,
    v_proj for ``qkv_proj``)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        for members in packed.values():
            if part in members and len(members) > 1:
                return [".".join(parts[:i] + [m] + parts[i + 1:]) for m in members if m != part]
    return []


def hf_param_shapes(config: Any) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """HF checkpoint names and shapes, and the aliases of tied parameters (a tied output layer
    -> the input embedding), from a model built on the meta device (no memory, no reads)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes: dict[str, tuple[int, ...]] = {}
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        shapes[name] = tuple(p.shape)
        canonical = first.setdefault(id(p), name)
        if canonical != name:
            aliases[name] = canonical
    return shapes, aliases


def canonical(items: list[tuple[str, torch.Tensor]],
               aliases: dict[str, str]) -> list[tuple[str, torch.Tensor]]:
    """Tied parameters under the name vLLM loads (it ignores a tied ``lm_head.weight``); when
    both names are given the later one wins, as in a plain copy into the shared tensor."""
    out: dict[str, torch.Tensor] = {}
    for name, t in items:
        out[aliases.get(name, name)] = t
    return list(out.items())


def shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def save_safetensors(items: list[tuple[str, torch.Tensor]], path: str) -> None:
    from safetensors.torch import save_file

    save_file({n: t.clone() for n, t in items}, path)
