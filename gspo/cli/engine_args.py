"""``gspo serve``'s flags as ``ServerSettings`` arguments, and ``--vllm-arg key=value``: any
vLLM engine argument without a flag of its own. Light (no torch): the CLI parses before heavy
imports, and tests/deploy/test_compose.py reads the compose file's commands through the
same code."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def parse_engine_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``["swap_space=8", "kv_cache_dtype=fp8"]`` -> ``{"swap_space": 8, "kv_cache_dtype":
    "fp8"}``. A value that parses as JSON is taken as JSON (numbers, booleans, objects), any
    other as a string; dashes in keys become underscores (``max-num-batched-tokens``)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise ValueError(f"{pair!r}: expected key=value with a Python identifier as key")
        if key in out:
            raise ValueError(f"{key!r} given twice")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def serve_flags(params: dict[str, Any]) -> dict[str, Any]:
    """``ServerSettings`` keyword arguments from ``gspo serve``'s parsed flags: unset flags
    are left out (env vars and defaults apply), the nested and parsed ones are built."""
    from gspo_rl.cli.options import SERVE_AFTER_VLLM_ARG

    queue = {flag: path.split(".", 1)[1] for flag, path in SERVE_AFTER_VLLM_ARG.items()
             if path.startswith("queue.")}
    skip = ("log_level", "vllm_arg", "config", *queue)
    flags = {k: v for k, v in params.items() if v is not None and k not in skip}
    nested = {field: params[flag] for flag, field in queue.items()
              if params.get(flag) is not None}
    if nested:
        flags["queue"] = nested
    if params.get("vllm_arg"):
        flags["vllm_args"] = parse_engine_args(params["vllm_arg"])
    return flags
