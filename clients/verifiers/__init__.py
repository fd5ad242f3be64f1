"""Verifiers: a completion and a reference answer in, a ``Verdict`` (reward, correct) out.

    from gspo_rl.client.verifiers import make_verifier
    verify = make_verifier("numeric", format_reward=0.1)
    verify("... so the answer is 12.", "12")   # Verdict(reward=1.0, correct=True)

Kinds: ``exact``, ``normalized``, ``numeric`` (no dependency), ``math`` (math-verify),
``regex``, ``json_schema`` (jsonschema), ``python`` (your function). Options common to all:
``extract`` (a regex: the answer is its last match, or that match's group) and
``format_reward``. Reference: docs/tasks.md.
"""

from __future__ import annotations

from typing import Any

from gspo_rl.client.verifiers.base import Verdict, Verifier
from gspo_rl.client.verifiers.numeric import MathVerify, NumericMatch
from gspo_rl.client.verifiers.python import PythonVerifier, load_callable
from gspo_rl.client.verifiers.schema import JsonSchema
from gspo_rl.client.verifiers.text import ExactMatch, NormalizedMatch, RegexMatch

KINDS: dict[str, type[Verifier]] = {
    v.kind: v for v in (ExactMatch, NormalizedMatch, NumericMatch, MathVerify, RegexMatch,
                        JsonSchema, PythonVerifier)}


def make_verifier(kind: str, **options: Any) -> Verifier:
    """The verifier ``kind`` with ``options``; ValueError for an unknown kind or option."""
    cls = KINDS.get(kind)
    if cls is None:
        raise ValueError(f"unknown verifier {kind!r}: {' | '.join(KINDS)}")
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"verifier {kind!r}: {exc}") from None


__all__ = ["KINDS", "ExactMatch", "JsonSchema", "MathVerify", "NormalizedMatch",
           "NumericMatch", "PythonVerifier", "RegexMatch", "Verdict", "Verifier",
           "load_callable", "make_verifier"]
