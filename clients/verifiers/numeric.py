"""Numeric answers: ``numeric`` (this module's own parser, no dependency) and ``math``
(Hugging Face's ``math-verify``: LaTeX, expressions, sets; the ``math`` extra).

``numeric`` reads the answer of a completion as: the last ``\\boxed{...}``, else what follows
the last ``####``, else what follows the last "answer is" / "answer:", else the last number in
the text; with ``extract``, the last match of that pattern instead. A number is an integer or a
decimal (thousands separated by commas or not, an exponent, a sign), a fraction ``a/b`` or a
LaTeX ``\\frac{a}{b}``, a trailing ``%`` ignored. It equals the reference when
``|x - ref| <= tolerance * max(1, |ref|)`` (exact rationals: 0.1 + 0.2 is 0.3).
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, cast

from gspo_rl.client.verifiers.base import Verifier

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+"
_LATEX_FRAC = rf"\\d?frac\s*\{{\s*({_NUMBER})\s*\}}\s*\{{\s*({_NUMBER})\s*\}}"
_ANY = re.compile(rf"{_LATEX_FRAC}|(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?")
_WHOLE_FRAC = re.compile(rf"^(?:{_LATEX_FRAC}|({_NUMBER})\s*/\s*({_NUMBER}))$")
_WHOLE_NUMBER = re.compile(rf"^(?:{_NUMBER})$")
_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*([^\n]*)", re.IGNORECASE)


# Numbers beyond 10**+-MAX_EXPONENT are not compared: made exact, "9e999999999" is a
# billion-digit integer (minutes of CPU on the caller's thread, a sampled completion's choice).
MAX_EXPONENT = 1000


def _decimal(text: str) -> Fraction:
    try:
        value = Decimal(text.replace(",", ""))
    except (InvalidOperation, ValueError):
        raise ValueError(f"not a number: {text!r}") from None
    if not value.is_finite() or abs(value.adjusted()) > MAX_EXPONENT:
        raise ValueError(f"not a number compared here: {text[:40]!r} (beyond 1e{MAX_EXPONENT})")
    return Fraction(value)


def parse_number(text: str) -> Fraction | None:
    """The number ``text`` is (module docstring), exactly; None when it is not one."""
    s = text.strip().strip("$").replace("\\,", "").replace("\\!", "").strip()
    s = s.removesuffix(".").removesuffix("\\%").removesuffix("%").strip()
    try:
        m = _WHOLE_FRAC.match(s)
        if m is not None:
            num, den = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            d = _decimal(den)
            return None if d == 0 else _decimal(num) / d
        return _decimal(s) if _WHOLE_NUMBER.match(s) else None
    except ValueError:  # beyond MAX_EXPONENT
        return None


def last_number(text: str) -> Fraction | None:
    """The last number in ``text`` (fractions included), or None."""
    for m in reversed(list(_ANY.finditer(text))):
        value = parse_number(m.group(0))
        if value is not None:
            return value
    return None


def find_answer(text: str) -> Fraction | None:
    """The answer of a completion (module docstring), or None."""
    for pattern in (_BOXED, _HASHES, _ANSWER_IS):
        found = pattern.findall(text)
        if found:
            value = last_number(found[-1])
            if value is not None:
                return value
    return last_number(text)


def reference_number(answer: Any) -> Fraction:
    """A reference answer as a number; ValueError when it is not one (a broken task)."""
    if isinstance(answer, bool):
        raise ValueError(f"a numeric reference answer must be a number, got {answer!r}")
    if isinstance(answer, int | float):
        return Fraction(repr(answer)) if isinstance(answer, float) else Fraction(answer)
    value = find_answer(str(answer)) if answer is not None else None
    if value is None:
        raise ValueError(f"the reference answer {answer!r} holds no number")
    return value


class NumericMatch(Verifier):
    """The completion's number equals the reference within ``tolerance`` (relative, or
    absolute below 1)."""

    kind = "numeric"

    def __init__(self, *, tolerance: float = 1e-6, **options: Any) -> None:
        super().__init__(**options)
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance}")
        self.tolerance = Fraction(repr(float(tolerance)))

    def judge(self, completion: str, answer: Any,
              task: Mapping[str, Any]) -> tuple[bool, bool]:
        ref = reference_number(answer)
        got = self.extracted(completion)
        value = None if got is None else (
            find_answer(got) if self.extract is None else last_number(got))
        if value is None:
            return False, False
        return abs(value - ref) <= self.tolerance * cast("Fraction | int", max(1, abs(ref))), True


class MathVerify(Verifier):
    """``math_verify.verify(parse(reference), parse(answer))``. Its time limits use
    ``signal.alarm``, which works in the main thread only: elsewhere they are off."""

    kind = "math"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        try:
            import math_verify  # noqa: F401
        except ImportError as exc:
            raise ImportError("the math verifier needs math-verify: pip install "
                              "'gspo-rl-client[math]' (or use the numeric verifier, which "
                              "needs nothing)") from exc

    def judge(self, completion: str, answer: Any,
              task: Mapping[str, Any]) -> tuple[bool, bool]:
        from math_verify import parse, verify

        timed = threading.current_thread() is threading.main_thread() and hasattr(
            signal, "SIGALRM")
        limits: dict[str, Any] = {} if timed else {"parsing_timeout": None}
        gold = parse(str(answer), **limits)
        if not gold:
            raise ValueError(f"math-verify cannot read the reference answer {answer!r}")
        got = self.extracted(completion)
        pred = parse(got, **limits) if got else []
        if not pred:
            return False, False
        return bool(verify(gold, pred, **({} if timed else {"timeout_seconds": None}))), True
