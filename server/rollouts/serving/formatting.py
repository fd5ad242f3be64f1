"""Engine completions -> the JSON shapes of the sampling routes (log-probabilities, usage).

Pure functions of a completion and the tokenizer's token texts: no I/O, no engine. A
log-probability is shown no lower than ``LOGPROB_FLOOR`` (vLLM's convention): an alternative
outside the ``top_p`` / ``top_k`` cut is -inf, which JSON cannot carry (it became a null,
against the response schema). The recorded trajectory keeps the engine's values.
"""

from __future__ import annotations

import uuid

from gspo_rl.server.engines.sampler import Completion
from gspo_rl.server.rollouts.chat.render import TokenTexts
from gspo_rl.server.rollouts.protocol.base import TokenLogprob, TopLogprob, Usage
from gspo_rl.server.rollouts.protocol.chat import ChoiceLogprobs
from gspo_rl.server.rollouts.protocol.completions import CompletionLogprobs
from gspo_rl.server.rollouts.sampling import GroupResult

LOGPROB_FLOOR = -9999.0


def shown(logprob: float) -> float:
    """A log-probability as a response shows it: -inf (and NaN) as ``LOGPROB_FLOOR``."""
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def shown_all(logprobs: list[float]) -> list[float]:
    return [shown(x) for x in logprobs]


def response_id(prefix: str, result: GroupResult) -> str:
    """The response's ``id``: named after its group, or fresh when nothing was recorded."""
    return f"{prefix}{result.group_id or uuid.uuid4().hex}"


def usage(result: GroupResult) -> Usage:
    """Prompt tokens count once for all n samples, as OpenAI counts them."""
    p, c = len(result.prompt_token_ids), result.completion_tokens
    return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)


def top_logprobs(texts: TokenTexts, pairs: list[tuple[int, float]], k: int) -> list[TopLogprob]:
    out = []
    for token_id, logprob in pairs[:k]:
        text, raw = texts.get(token_id)
        out.append(TopLogprob(token=text, logprob=shown(logprob), bytes=list(raw)))
    return out


def _tops(c: Completion, j: int) -> list[tuple[int, float]]:
    return c.top_logprobs[j] if c.top_logprobs is not None and j < len(c.top_logprobs) else []


def chat_logprobs(texts: TokenTexts, c: Completion, k: int) -> ChoiceLogprobs:
    """``choices[i].logprobs.content``: one entry per generated token."""
    content = []
    for j, (token_id, logprob) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
        text, raw = texts.get(token_id)
        content.append(TokenLogprob(token=text, logprob=shown(logprob), bytes=list(raw),
                                    top_logprobs=top_logprobs(texts, _tops(c, j), k)))
    return ChoiceLogprobs(content=content)


def completion_logprobs(texts: TokenTexts, c: Completion, k: int) -> CompletionLogprobs:
    """Legacy completions shape; ``text_offset`` counts characters from the completion's
    start (no echo)."""
    tokens = [texts.text(t) for t in c.token_ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    tops = None
    if k > 0:
        tops = [{texts.text(t): shown(lp) for t, lp in _tops(c, j)[:k]}
                for j in range(len(tokens))]
    return CompletionLogprobs(tokens=tokens, token_logprobs=shown_all(c.logprobs),
                              top_logprobs=tops, text_offset=offsets)


def rollout_top_logprobs(texts: TokenTexts, c: Completion, k: int) -> list[list[TopLogprob]]:
    return [top_logprobs(texts, _tops(c, j), k) for j in range(len(c.token_ids))]
