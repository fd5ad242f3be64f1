"""What the multi-turn adapters (``openenv:``, ``textarena:``) share: one chat turn through the
official ``openai`` client, and their settings' validation.

``chat_reply`` asks the rollout server for the next assistant turn (the sampling keys the
client takes as arguments, ``OPENAI_KEYS``, as arguments; the others and the session's own
fields in ``extra_body``) and returns its text and the message to send back unchanged
(``assistant_message``). ``validated`` checks an adapter's settings model, refusing with one
``ValueError`` that names every bad key; ``check_seed`` is the ``seed`` setting's rule (true,
false or an int >= 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from gspo_rl.client.environment import EpisodeSession

M = TypeVar("M", bound=BaseModel)

OPENAI_KEYS = frozenset({"temperature", "top_p", "max_tokens", "max_completion_tokens", "stop",
                         "seed", "frequency_penalty", "presence_penalty", "logprobs",
                         "top_logprobs"})
"""Sampling keys the openai client takes as arguments; the others go in ``extra_body``."""


def assistant_message(message: Any) -> dict[str, Any]:
    """The assistant message as returned, to send back unchanged in the next turn."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    reasoning = getattr(message, "reasoning_content", None)
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    if message.tool_calls:
        out["tool_calls"] = [c.model_dump(exclude_none=True) for c in message.tool_calls]
    return out


async def chat_reply(llm: AsyncOpenAI, messages: list[dict[str, Any]],
                     session: EpisodeSession, sampling: Mapping[str, Any]
                     ) -> tuple[str, dict[str, Any]]:
    """The next assistant turn of ``messages``: its text and its message (module docstring)."""
    options = {k: v for k, v in sampling.items() if k in OPENAI_KEYS}
    extra = {k: v for k, v in sampling.items() if k not in OPENAI_KEYS}
    response = await llm.chat.completions.create(
        model=session.model, messages=messages,  # type: ignore[arg-type]  # plain dicts
        extra_body={**extra, **session.extra_body}, **options)
    message = response.choices[0].message
    return message.content or "", assistant_message(message)


def validated(model: type[M], args: dict[str, Any], prefix: str) -> M:
    """``args`` as ``model``; ValueError naming every bad key (``{prefix}: bad --env-arg``)."""
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'args'}: {e['msg']}"
                             for e in exc.errors())
        raise ValueError(f"{prefix}: bad --env-arg ({problems})") from None


def check_seed(seed: bool | int) -> bool | int:
    """The ``seed`` setting: true, false or an int >= 0."""
    if type(seed) is int and seed < 0:
        raise ValueError(f"seed must be true, false or an int >= 0, not {seed}")
    return seed
