"""The tool path of a verifiers 0.4 environment (``verifiers_envs/gspo_vf_tools``: an MCP
``lookup`` toolset), run unmodified through the adapter against a real rollout server (hf
engine, Qwen3's chat template with its hermes tool parser and qwen3 reasoning parser, real
Redis). What verifiers' ``null`` harness sends for the task ``alpha`` (its messages and its
``tools`` list) is captured from a first run of the untrained model; a tiny model copy is then
taught that conversation (call the tool with ``{"key": "alpha"}``, read its result, answer
"alpha is 17."), and a group of that task is played again. Checked: the model's tool call was
parsed by the server and run by verifiers (the second request carries the call and the MCP
tool's result), each episode is one rollout of two sampled turns whose prompt for the second
turn is the taught conversation's rendering, the tokens between the turns being the tool
result's rendering; every stored turn is, token for token, what the server returned; the
reward posted is 1.0 (the value was found through the tool)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.loading import load_environment
from gspo_rl.client.runner import arun_groups
from gspo_rl.contract.schema import Keys, unpack_rollout
from gspo_rl.redisq.groups.types import QueueConfig
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, running_server
from tests.helpers.spies import Calls, relay_calls
from tests.helpers.template_models import make_template_model, teach_conversation

pytest.importorskip("verifiers.v1", reason="the verifiers extra is not installed")

pytestmark = pytest.mark.slow

SPEC = f"verifiers:{Path(__file__).parent / 'verifiers_envs' / 'gspo_vf_tools'}"
KEY, VALUE = "alpha", "17"  # gspo_vf_tools.toolset.TABLE
KEYS = Keys()
# Qwen3's rendering of a tool result after the assistant's turn (its end token included in
# the turn): the result in the user turn, then the next generation prompt.
TOOL_RESULT = f"\n<|im_start|>user\n<tool_response>\n{VALUE}\n</tool_response><|im_end|>\n" \
              "<|im_start|>assistant\n"
SERVER = {"tool_call_parser": "hermes", "reasoning_parser": "qwen3", "max_tokens": 128,
          # a taught group's rewards are all 1.0: published, not dropped (its records kept)
          "queue": QueueConfig(drop_zero_variance=False)}


@pytest.fixture
def calls() -> Iterator[Calls]:
    with relay_calls() as seen:
        yield seen


def environment(seed: int = 0, max_tokens: int = 96) -> Any:
    sampling = {"max_tokens": max_tokens, "temperature": 0.3}
    return load_environment(SPEC, args={"group_size": 2, "harness": "null", "seed": seed,
                                        "sampling": sampling})


def seed_for(key: str) -> int:
    """A task-order seed whose first group is ``key``'s task (the adapter's own order)."""
    from gspo_rl.client.adapters.verifiers.environment import TaskStream

    taskset = environment().env.taskset
    return next(s for s in range(200) if TaskStream(taskset, s).next().data.id == key)


def streamed(events: list[str]) -> str:
    """The deltas of an answer's stream (what the model produced, as the harness read it)."""
    return " ".join(json.dumps(c["delta"]) for e in events
                    for c in json.loads(e).get("choices", []) if c.get("delta"))


def play_one_group(env: Any, url: str) -> Any:
    async def main() -> list[Any]:
        async with AsyncGSPOClient(url, api_key=API_KEY) as client:
            return await arun_groups(env, client, 1, concurrency=2)

    (outcome,) = asyncio.run(main())
    return outcome


def taught_conversation(messages: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
    """The captured first request's messages, then the turns the model is taught: the tool
    call (arguments as a dict, as templates read them), its result, the answer."""
    call = {"id": "call_0", "type": "function",
            "function": {"name": tool, "arguments": {"key": KEY}}}
    return [*messages,
            {"role": "assistant", "content": "", "reasoning_content": f"I should look {KEY} up.",
             "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": VALUE},
            {"role": "assistant", "content": f"{KEY} is {VALUE}.",
             "reasoning_content": f"The tool said {VALUE}."}]


def test_the_taught_model_looks_the_key_up_through_verifiers_tool(
        tmp_path: Path, redis_server: RedisServer, r: redis.Redis, calls: Calls) -> None:
    from transformers import AutoTokenizer

    seed = seed_for(KEY)
    path = make_template_model(tmp_path / "model", "qwen3")

    # 1. What verifiers sends for the task (the untrained model says anything: a few tokens).
    with running_server(path, redis_server.url, **SERVER) as s:
        first = play_one_group(environment(seed, max_tokens=8), s.url)
    assert first.task.data.id == KEY
    request = calls.bodies[first.rollout_ids[0]][0]
    messages, tools = request["messages"], request["tools"]
    assert messages[-1]["role"] == "user" and KEY in messages[-1]["content"], messages
    (tool,) = [t["function"]["name"] for t in tools]
    assert "lookup" in tool, tools

    # 2. The model taught that conversation, with the tools verbatim.
    conversation = taught_conversation(messages, tool)
    teach_conversation(path, conversation, tools)
    tok = AutoTokenizer.from_pretrained(path)
    second_prompt = tok.apply_chat_template(conversation[:-1], tools=tools, tokenize=False,
                                            add_generation_prompt=True)

    # 3. The task played again by the taught model.
    for seen in (calls.bodies, calls.sampled, calls.events):
        seen.clear()
    with running_server(path, redis_server.url, **SERVER) as s:
        outcome = play_one_group(environment(seed), s.url)
    assert outcome.task.data.id == KEY and len(outcome.rollout_ids) == 2
    for rid, reward in zip(outcome.rollout_ids, outcome.rewards, strict=True):
        produced = streamed(calls.events[rid])
        bodies = calls.bodies[rid]
        assert len(bodies) == 2, f"not two model calls: the model did not call the tool: {produced}"
        # the call the server parsed from the model's text came back in the history, and
        # verifiers' MCP tool answered it
        *_, asked, result = bodies[1]["messages"]
        assert asked["role"] == "assistant", bodies[1]["messages"]
        (call,) = asked["tool_calls"]
        assert call["function"]["name"] == tool
        assert json.loads(call["function"]["arguments"]) == {"key": KEY}
        assert result["role"] == "tool" and result["tool_call_id"] == call["id"]
        assert result["content"] == VALUE, result
        assert bodies[1]["tools"] == tools
        # one rollout, two sampled turns, each token for token what the server returned
        rec = unpack_rollout(r.get(KEYS.rollout(rid)))
        sampled = [rec.token_ids[a:b].tolist() for a, b in rec.turns]
        assert sampled == calls.sampled[rid], "the stored turns are not what the model wrote"
        assert len(rec.turns) == 2
        (_, end1), (start2, _) = rec.turns
        assert tok.decode(rec.token_ids[end1:start2]) == TOOL_RESULT
        assert tok.decode(rec.token_ids[:start2]) == second_prompt
        assert VALUE in tok.decode(sampled[1]), produced
        assert reward == 1.0 and float(r.hget(KEYS.episode(rid), "reward") or reward) == reward
