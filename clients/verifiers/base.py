"""What a verifier is: a completion and a task's reference answer in, a ``Verdict`` out.

A verdict says whether the answer is correct (what pass@k counts) and what reward it earns:
1.0 when correct, else ``format_reward`` when the verifier could read an answer at all (a
number, a JSON value, a match of ``extract``) and 0.0 when it could not. A small format reward
gives a group variance (a learning signal) before any answer is right. A reference answer the
verifier cannot use (a numeric verifier given "n/a") raises ``ValueError``: a broken task is an
error, never a reward of 0.0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    reward: float
    correct: bool


class Verifier:
    """Base class: subclasses implement ``judge`` (correct?, parsed?)."""

    kind = "verifier"

    def __init__(self, *, extract: str | None = None, format_reward: float = 0.0) -> None:
        if not 0.0 <= format_reward < 1.0:
            raise ValueError(f"format_reward must be in [0, 1), got {format_reward}")
        self.extract = re.compile(extract, re.DOTALL) if extract else None
        if self.extract is not None and self.extract.groups > 1:
            raise ValueError("extract must have at most one group (the answer)")
        self.format_reward = format_reward

    def __call__(self, completion: str, answer: Any,
                 task: Mapping[str, Any] | None = None) -> Verdict:
        correct, parsed = self.judge(completion, answer, task or {})
        reward = 1.0 if correct else (self.format_reward if parsed else 0.0)
        return Verdict(reward=reward, correct=correct)

    def judge(self, completion: str, answer: Any,
              task: Mapping[str, Any]) -> tuple[bool, bool]:
        raise NotImplementedError

    def extracted(self, completion: str) -> str | None:
        """The answer part of ``completion``: the last match of ``extract`` (its group when it
        has one); the whole completion without ``extract``; None when it does not match."""
        if self.extract is None:
            return completion
        matches = list(self.extract.finditer(completion))
        if not matches:
            return None
        last = matches[-1]
        return last.group(1) if self.extract.groups else last.group(0)
