"""``gspo serve --vllm-arg key=value``: any vLLM engine argument, without a flag of its own."""

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
