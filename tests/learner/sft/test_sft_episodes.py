"""SFT trains on the tokens RL episodes record. A tiny model with Qwen3's (or Llama 3.3's) real
chat template is taught a tool-calling conversation by ``gspo sft``; then it runs the same
conversation as a multi-turn episode on a real rollout server (hf engine, uvicorn, redis, the
official openai client, the template's tool-call and reasoning parsers): the trajectory the
server records is, token for token and mask for mask, the demonstration SFT trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
import torch
from transformers import AutoTokenizer

from gspo_rl.contract.schema import Keys, unpack_rollout
from gspo_rl.learner.sft.config import SFTConfig
from gspo_rl.learner.sft.data import Layout, read_demonstrations
from gspo_rl.learner.sft.train import run_sft
from tests.conftest import RedisServer
from tests.helpers.serving import running_server
from tests.helpers.template_models import (
    LOOKUP,
    LOOKUP_CONVERSATIONS,
    as_sent,
    lookup_episode,
    make_template_model,
)

PARSERS = {"qwen3": {"tool_call_parser": "hermes", "reasoning_parser": "qwen3"},
           "llama3": {"tool_call_parser": "llama3_json", "reasoning_parser": "none"}}


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_the_episode_records_the_demonstrations_tokens(family: str, tmp_path: Path,
                                                       redis_mod: RedisServer) -> None:
    model = make_template_model(tmp_path / "model", family)
    data = tmp_path / "demo.jsonl"
    # the demonstration as SFT data hold it: the OpenAI API's form (null content beside tool
    # calls, arguments a JSON string), which the data reader turns into the template's form
    demo_messages = as_sent(LOOKUP_CONVERSATIONS[family])
    data.write_text(json.dumps({"messages": demo_messages, "tools": [LOOKUP]}) + "\n")
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
        _, rid = lookup_episode(s.url, family)
    rec = unpack_rollout(redis.Redis.from_url(redis_mod.url).get(Keys().rollout(rid)))
    assert len(rec.turns) == 2 and rec.metadata["history_rewrites"] == 0
    assert rec.token_ids.tolist() == demo.token_ids.tolist()
    assert rec.loss_mask.tolist() == demo.loss_mask.tolist()
