"""Text verifiers: ``exact`` (the answer as written), ``normalized`` (case, punctuation,
articles and spacing ignored, SQuAD's rule) and ``regex`` (a pattern found in the completion)."""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Mapping
from typing import Any

from gspo_rl.client.verifiers.base import Verifier

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """Lower case, NFKC, punctuation and English articles removed, spaces collapsed."""
    text = unicodedata.normalize("NFKC", text).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _answers(answer: Any) -> list[str]:
    """A reference answer, or a list of acceptable ones, as strings."""
    items = answer if isinstance(answer, list | tuple) else [answer]
    if not items or any(a is None for a in items):
        raise ValueError(f"a text verifier needs a reference answer, got {answer!r}")
    return [str(a) for a in items]


class ExactMatch(Verifier):
    """The extracted answer equals a reference answer (surrounding spaces ignored)."""

    kind = "exact"

    def judge(self, completion: str, answer: Any,
              task: Mapping[str, Any]) -> tuple[bool, bool]:
        golds = _answers(answer)
        got = self.extracted(completion)
        if got is None:
            return False, False
        return got.strip() in [g.strip() for g in golds], bool(got.strip())


class NormalizedMatch(Verifier):
    """``normalize(answer) == normalize(reference)``; ``contains``: the normalised reference
    appears in the normalised answer as whole words instead."""

    kind = "normalized"

    def __init__(self, *, contains: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.contains = contains

    def judge(self, completion: str, answer: Any,
              task: Mapping[str, Any]) -> tuple[bool, bool]:
        golds = [normalize(g) for g in _answers(answer)]
        got = self.extracted(completion)
        if got is None:
            return False, False
        mine = normalize(got)
        if self.contains:
            padded = f" {mine} "
            return any(g and f" {g} " in padded for g in golds), bool(mine)
        return mine in golds, bool(mine)


class RegexMatch(Verifier):
    """``pattern`` is searched in the completion (``fullmatch``: must match all of it,
    surrounding spaces ignored); ``{answer}`` in it stands for the reference answer, escaped.
    Without ``pattern`` the reference answer is the pattern."""

    kind = "regex"

    def __init__(self, *, pattern: str | None = None, fullmatch: bool = False,
                 ignore_case: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.pattern, self.fullmatch = pattern, fullmatch
        self.flags = re.IGNORECASE if ignore_case else 0
        if pattern is not None and "{answer}" not in pattern:
            re.compile(pattern, self.flags)  # a bad pattern fails when the verifier is built

    def judge(self, completion: str, answer: Any,
              task: Mapping[str, Any]) -> tuple[bool, bool]:
        if self.pattern is None:
            pattern = str(_answers(answer)[0])
        elif "{answer}" in self.pattern:
            pattern = self.pattern.replace("{answer}", re.escape(_answers(answer)[0]))
        else:
            pattern = self.pattern
        try:
            regex = re.compile(pattern, self.flags | re.DOTALL)
        except re.error as exc:
            raise ValueError(f"bad regex {pattern!r}: {exc}") from None
        got = self.extracted(completion)
        if got is None:
            return False, False
        found = regex.fullmatch(got.strip()) if self.fullmatch else regex.search(got)
        return found is not None, found is not None
