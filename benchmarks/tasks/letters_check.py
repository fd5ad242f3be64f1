"""The verifier of the letters task (``letters.toml``): the fraction of the completion's first
``WORDS`` words (runs of ASCII letters) that start with a letter of the asked range.

Partial credit: one right word of three earns 1/3, a completion with fewer words earns nothing
for the missing ones. A tiny random model starts near 0.4 (about half its words start in the
asked half of the alphabet, and some completions hold fewer than three words) and must read
the prompt, in five phrasings, and keep to it for every word to pass 0.7: a longer curve than
the alphabet demo's, where one letter decides. (Ranges of 7 letters did not move from 0.28 in
90 steps on the tiny model: too hard to measure anything with.)
"""

from __future__ import annotations

import re

WORDS = 3
_WORD = re.compile(r"[a-z]+")


def check(completion: str, answer: str, task: dict) -> float:
    """``answer``: the letters of the asked half ("abcdefghijklm")."""
    if not answer or not answer.isalpha():
        raise ValueError(f"the answer must be the range's letters, got {answer!r}")
    words = _WORD.findall(completion.lower())[:WORDS]
    return sum(w[0] in answer for w in words) / WORDS
