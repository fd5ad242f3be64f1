"""SFT trains on the tokens RL episodes record. A tiny model with Qwen3's (or Llama 3.3's) real
chat template is taught a tool-calling conversation by ``gspo sft``; then it runs the same
conversation as a multi-turn episode on a real rollout server (hf engine, uvicorn, redis, the
official openai client, the template's tool-call and reasoning parsers): the trajectory the
server records is, token for token and mask for mask, the demonstration SFT trained on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import torch
from transformers import AutoTokenizer

from gspo_rl.contract.schema import Keys, unpack_rollout
from gspo_rl.learner.sft.config import SFTConfig
from gspo_rl.learner.sft.data import Layout, read_demonstrations
from gspo_rl.learner.sft.train import run_sft
from tests.conftest import RedisServer
from tests.helpers.serving import API_KEY, MODEL_NAME, running_server
from tests.helpers.template_models import LOOKUP, echo_assistant, make_template_model

CALL = {"id": "call_0", "type": "function",
        "function": {"name": "lookup", "arguments": '{"key": "k"}'}}
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "qwen3": [
        {"role": "user", "content": "What is the value of k?"},
        {"role": "assistant", "content": None, "reasoning_content": "I should look k up.",
         "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "42"},
        {"role": "assistant", "content": "k is 42.", "reasoning_content": "The tool said 42."},
    ],
    "llama3": [
        {"role": "system", "content": "Use the lookup tool."},
        {"role": "user", "content": "What is the value of k?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "42"},
        {"role": "assistant", "content": "k is 42."},
    ],
}
PARSERS = {"qwen3": {"tool_call_parser": "hermes", "reasoning_parser": "qwen3"},
           "llama3": {"tool_call_parser": "llama3_json", "reasoning_parser": "none"}}


def _episode(url: str, family: str) -> str:
    """The conversation's first messages, then whatever the model does, the tool answering:
    returns the episode's rollout id."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    g = httpx.post(f"{url}/v1/groups", json={"size": 1}, timeout=30,
                   headers={"Authorization": f"Bearer {API_KEY}"}).json()
    rid = g["rollout_ids"][0]
    conv = CONVERSATIONS[family]
    messages = conv[:next(i for i, m in enumerate(conv) if m["role"] == "assistant")]
    for _ in range(2):
        msg = client.chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=[LOOKUP], max_tokens=48,
            temperature=0.3, seed=1, extra_body={"rollout_id": rid}).choices[0].message
        if not msg.tool_calls:
            return rid
        (call,) = msg.tool_calls
        value = {"k": "42"}.get(json.loads(call.function.arguments)["key"], "")
        messages = [*messages, echo_assistant(msg),
                    {"role": "tool", "tool_call_id": call.id, "content": value}]
    return rid


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_the_episode_records_the_demonstrations_tokens(family: str, tmp_path: Path,
                                                       redis_mod: RedisServer) -> None:
    model = make_template_model(tmp_path / "model", family)
    data = tmp_path / "demo.jsonl"
    data.write_text(json.dumps({"messages": CONVERSATIONS[family], "tools": [LOOKUP]}) + "\n")
    cfg = SFTConfig(model=str(model), data=str(data), save_dir=str(tmp_path / "sft"),
                    epochs=150, batch_size=1, lr=1e-2, grad_clip=None,
                    save_every=1000)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on shared cores
    try:
        result = run_sft(cfg)
    finally:
        torch.set_num_threads(threads)
    assert result.losses[-1] < 5e-3, result.losses[-5:]
    (demo,) = read_demonstrations(data, Layout(AutoTokenizer.from_pretrained(model)))
    with running_server(result.checkpoint, redis_mod.url, **PARSERS[family]) as s:
        rid = _episode(s.url, family)
    rec = unpack_rollout(redis.Redis.from_url(redis_mod.url).get(Keys().rollout(rid)))
    assert len(rec.turns) == 2 and rec.metadata["history_rewrites"] == 0
    assert rec.token_ids.tolist() == demo.token_ids.tolist()
    assert rec.loss_mask.tolist() == demo.loss_mask.tolist()
