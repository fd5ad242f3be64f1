"""Spies on what the environment adapters send and receive, passing everything through
unchanged: ``spy_on_chat`` (the openai client's chat completions, for ``openenv:`` and
``textarena:``) and ``relay_calls`` (verifiers' model relay, for ``verifiers:``)."""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from gspo_rl.contract.schema import Keys, unpack_rollout


def spy_on_chat(monkeypatch: pytest.MonkeyPatch, r: redis.Redis) -> list[dict[str, Any]]:
    """Every chat completion the episodes make: its messages, its response and the episode's
    record in Redis right after it (a group dropped for equal rewards loses its records once
    rewarded)."""
    from openai.resources.chat.completions import AsyncCompletions

    calls: list[dict[str, Any]] = []
    real = AsyncCompletions.create

    async def create(self: AsyncCompletions, **kwargs: Any) -> Any:
        messages = [dict(m) for m in kwargs["messages"]]
        response = await real(self, **kwargs)
        rid = kwargs["extra_body"]["rollout_id"]
        calls.append({"rid": rid, "messages": messages, "response": response,
                      "record": unpack_rollout(r.get(Keys().rollout(rid)))})
        return response

    monkeypatch.setattr(AsyncCompletions, "create", create)
    return calls


@dataclass
class Calls:
    """What went through verifiers' model relay, per rollout: each request body, and each
    answer's sampled token ids and streamed events."""

    bodies: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    sampled: dict[str, list[list[int]]] = field(default_factory=lambda: defaultdict(list))
    events: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


@contextlib.contextmanager
def relay_calls() -> Iterator[Calls]:
    """A spy on verifiers' model relay while the block runs: the request and the streamed
    answer pass through unchanged."""
    from gspo_rl.client.adapters.verifiers import hooks

    hooks.install()
    relay = hooks._CLASSES[0][1]
    original = relay.relay
    seen = Calls()

    async def spy(self: Any, dialect: Any, body: dict, session_id: str | None = None,
                  headers: Any = None) -> Any:
        binding = hooks._BINDINGS.get(session_id or "")
        rid = binding.rollout_id if binding and binding.rollout_id else None
        if rid is not None:
            seen.bodies[rid].append(json.loads(json.dumps(body)))
        reply = await original(self, dialect, body, session_id, headers)
        chunks = reply.chunks

        async def watched() -> Any:
            async for chunk in chunks:
                for line in chunk.decode().splitlines():
                    if rid is not None and line.startswith("data: {"):
                        seen.events[rid].append(line[6:])
                        for choice in json.loads(line[6:]).get("choices", []):
                            if choice.get("token_ids") is not None:
                                seen.sampled[rid].append(list(choice["token_ids"]))
                yield chunk

        reply.chunks = watched()
        return reply

    relay.relay = spy
    try:
        yield seen
    finally:
        relay.relay = original


