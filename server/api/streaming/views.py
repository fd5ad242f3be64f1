"""The chunks of an incrementally streamed group, per route (``gspo_rl.server.api.streaming.sse``
says what they carry; ``gspo_rl.server.api.streaming.group`` sends them). One view per request; its
state per choice is what has been sent so far, so that the final chunk sends exactly the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gspo_rl.server.engines.sampler import Completion, Partial
from gspo_rl.server.rollouts.chat.render import TokenTexts
from gspo_rl.server.rollouts.partial_text import TextStream, remainder, stable_split
from gspo_rl.server.rollouts.protocol.chat import ChatChoice
from gspo_rl.server.rollouts.protocol.completions import CompletionChoice
from gspo_rl.server.rollouts.sampling import GenerationPlan
from gspo_rl.server.rollouts.serving.formatting import chat_logprobs, completion_logprobs


@dataclass
class _Sent:
    """What one choice's chunks have said so far."""

    text: TextStream
    reasoning: str = ""
    content: str = ""
    tokens: int = 0  # tokens whose log-probabilities were sent
    chars: int = 0  # completions: characters of those tokens (the next text_offset)


def _span(p: Partial, start: int) -> Completion:
    """Tokens [start, p.length) of a partial completion, for the formatting functions."""
    tops = p.top_logprobs[start:p.length] if p.top_logprobs is not None else None
    return Completion(token_ids=p.token_ids[start:p.length], logprobs=p.logprobs[start:p.length],
                      policy_versions=[], finish_reason="length", top_logprobs=tops)


def as_partial(c: Completion) -> Partial:
    return Partial(c.token_ids, c.logprobs, c.top_logprobs, len(c.token_ids))


def rl_fields(choice: Any) -> dict[str, Any]:
    return {"rollout_id": choice.rollout_id, "token_ids": choice.token_ids,
            "prompt_token_ids": choice.prompt_token_ids,
            "policy_version": choice.policy_version, "policy_versions": choice.policy_versions}


class _View:
    def __init__(self, tokenizer: Any, texts: TokenTexts, end_ids: tuple[int, ...],
                 plan: GenerationPlan, top_k: int | None) -> None:
        self.texts, self.top_k = texts, top_k
        self.sent = [_Sent(TextStream(tokenizer, end_ids, plan.params.stop))
                     for _ in range(plan.n)]

    def _text(self, index: int, p: Partial) -> str:
        sent = self.sent[index]
        sent.text.update(p.token_ids, p.length)
        return sent.text.stable()


class ChatView(_View):
    """Content and reasoning deltas; tool calls whole in the final chunk."""

    obj, id_prefix = "chat.completion.chunk", "chatcmpl-"

    def __init__(self, tokenizer: Any, texts: TokenTexts, end_ids: tuple[int, ...],
                 plan: GenerationPlan, top_k: int | None, *, reasoning_parser: str,
                 thinking: bool, with_tools: bool) -> None:
        super().__init__(tokenizer, texts, end_ids, plan, top_k)
        self.parser, self.thinking, self.with_tools = reasoning_parser, thinking, with_tools

    def _plain(self) -> bool:
        """No parser can claim any text: the content is a string from the first chunk."""
        return not self.with_tools and (self.parser == "none" or not self.thinking)

    def opening(self, n: int) -> list[dict[str, Any]]:
        role = {"role": "assistant", **({"content": ""} if self._plain() else {})}
        return [{"index": i, "delta": role, "logprobs": None, "finish_reason": None}
                for i in range(n)]

    def progress(self, index: int, p: Partial) -> dict[str, Any] | None:
        sent = self.sent[index]
        reasoning, content = stable_split(self._text(index, p), self.parser, self.thinking)
        delta: dict[str, Any] = {}
        if len(reasoning) > len(sent.reasoning):
            delta["reasoning_content"] = remainder(reasoning, sent.reasoning)
            sent.reasoning = reasoning
        if not self.with_tools and len(content) > len(sent.content):
            delta["content"] = remainder(content, sent.content)
            sent.content = content
        logprobs = None
        if self.top_k is not None and p.length > sent.tokens:
            logprobs = chat_logprobs(self.texts, _span(p, sent.tokens), self.top_k).model_dump()
            sent.tokens = p.length
        if not delta and logprobs is None:
            return None
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}

    def final(self, index: int, c: ChatChoice) -> dict[str, Any]:
        sent, message = self.sent[index], c.message
        delta: dict[str, Any] = {}
        reasoning = remainder(message.reasoning_content, sent.reasoning)
        if reasoning:
            delta["reasoning_content"] = reasoning
        content = remainder(message.content, sent.content)
        if content or (message.content is not None and not self._plain()
                       and not sent.content):
            delta["content"] = content
        if message.tool_calls:
            delta["tool_calls"] = [{"index": j, **call.model_dump()}
                                   for j, call in enumerate(message.tool_calls)]
        logprobs = None
        if c.logprobs is not None and c.logprobs.content is not None:
            logprobs = {"content": [e.model_dump() for e in c.logprobs.content[sent.tokens:]]}
        return {"index": index, "delta": delta, "logprobs": logprobs,
                "finish_reason": c.finish_reason, **rl_fields(c)}


class CompletionView(_View):
    """Text deltas; the legacy log-probabilities with offsets from the completion's start."""

    obj, id_prefix = "text_completion", "cmpl-"

    def opening(self, n: int) -> list[dict[str, Any]]:
        return []

    def progress(self, index: int, p: Partial) -> dict[str, Any] | None:
        sent = self.sent[index]
        text = self._text(index, p)
        delta = remainder(text, sent.content) if len(text) > len(sent.content) else ""
        sent.content += delta
        logprobs = None
        if self.top_k is not None and p.length > sent.tokens:
            lp = completion_logprobs(self.texts, _span(p, sent.tokens), self.top_k)
            lp.text_offset = [sent.chars + o for o in lp.text_offset]
            sent.chars += sum(len(t) for t in lp.tokens)
            sent.tokens = p.length
            logprobs = lp.model_dump()
        if not delta and logprobs is None:
            return None
        return {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": None}

    def final(self, index: int, c: CompletionChoice) -> dict[str, Any]:
        sent = self.sent[index]
        logprobs = None
        if c.logprobs is not None:
            a, lp = sent.tokens, c.logprobs
            logprobs = {"tokens": lp.tokens[a:], "token_logprobs": lp.token_logprobs[a:],
                        "top_logprobs": lp.top_logprobs[a:] if lp.top_logprobs is not None
                        else None, "text_offset": lp.text_offset[a:]}
        return {"index": index, "text": remainder(c.text, sent.content), "logprobs": logprobs,
                "finish_reason": c.finish_reason, **rl_fields(c)}
