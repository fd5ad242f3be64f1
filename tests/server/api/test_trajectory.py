"""``GET /v1/groups/{id}?include=tokens``: what the learner will train on, readable through
the API (real server, hf engine, redis): token ids, loss mask, behaviour log-probs, per-token
versions, turn spans with decoded text, and the advantage once the group is published."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from gspo_rl.client.client import GSPOClient
from tests.helpers.serving import API_KEY, MODEL_NAME, Served

AUTH = {"Authorization": f"Bearer {API_KEY}"}



def _view(served: Served, gid: str, **params: str) -> dict[str, Any]:
    r = httpx.get(f"{served.url}/v1/groups/{gid}", params=params, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_single_turn_group_tokens_then_advantages(served: Served, tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with GSPOClient(served.url, api_key=API_KEY) as env:
        g = env.rollouts(prompt="hello world", n=2, max_tokens=6, temperature=1.0, seed=3)
        assert all("trajectory" not in r for r in _view(served, g.group_id)["rollouts"])
        view = _view(served, g.group_id, include="tokens")
        p = g.prompt_token_ids
        for r, got in zip(g.rollouts, view["rollouts"], strict=True):
            t = got["trajectory"]
            n = len(r.token_ids)
            assert t["source"] == "rollout" and t["advantage"] is None
            assert t["token_ids"] == p + r.token_ids and t["prompt_len"] == len(p)
            assert t["loss_mask"] == [0] * len(p) + [1] * n
            assert t["logprobs"][len(p):] == pytest.approx(r.logprobs, abs=1e-6)
            assert t["versions"] == [-1] * len(p) + [0] * n
            (turn,) = t["turns"]
            assert (turn["start"], turn["end"]) == (len(p), len(p) + n)
            assert turn["context_text"] == "hello world"
            assert turn["text"] == tok.decode(r.token_ids)
        env.post_rewards([{"rollout_id": r.rollout_id, "reward": float(i)}
                          for i, r in enumerate(g.rollouts)])
    deadline = time.monotonic() + 30
    while (view := _view(served, g.group_id, include="tokens"))["state"] != "published":
        assert time.monotonic() < deadline, view["state"]
        time.sleep(0.05)
    low, high = (r["trajectory"] for r in view["rollouts"])
    assert low["source"] == high["source"] == "ready_stream"
    assert low["advantage"] < 0 < high["advantage"]
    assert low["token_ids"] == p + g.rollouts[0].token_ids


def test_episode_turns_and_context(served: Served) -> None:
    gid, (rid,) = (lambda d: (d["group_id"], d["rollout_ids"]))(httpx.post(
        f"{served.url}/v1/groups", json={"size": 1}, headers=AUTH, timeout=30).json())
    client = openai.OpenAI(base_url=served.v1, api_key=API_KEY, max_retries=0, timeout=60)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "first question"}]
    c1 = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=5,
                                        extra_body={"rollout_id": rid}).choices[0]
    msgs += [{"role": "assistant", "content": c1.message.content},
             {"role": "user", "content": "second question"}]
    c2 = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=5,
                                        extra_body={"rollout_id": rid}).choices[0]
    t = _view(served, gid, include="tokens")["rollouts"][0]["trajectory"]
    assert t["token_ids"] == c2.model_extra["prompt_token_ids"] + c2.model_extra["token_ids"]
    first, second = t["turns"]
    assert "first question" in first["context_text"]
    assert "second question" in second["context_text"]
    assert first["text"].startswith(c1.message.content or "")
    assert sum(t["loss_mask"]) == (first["end"] - first["start"]) + (second["end"]
                                                                     - second["start"])


def _two_turns(client: openai.OpenAI, rid: str) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "first"}]
    for question in ("second", None):
        c = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=3,
                                           extra_body={"rollout_id": rid}).choices[0]
        if question:
            msgs += [{"role": "assistant", "content": c.message.content},
                     {"role": "user", "content": question}]


def test_per_turn_advantages_of_turn_bonuses(served: Served) -> None:
    """Equal totals, a bonus on a different turn each: the sequence advantages are 0 (what
    ``--loss gspo`` trains on) while the per-token losses train the second turns with -1 and
    +1 (the credit rule); the view shows both, per turn."""
    opened = httpx.post(f"{served.url}/v1/groups", json={"size": 2}, headers=AUTH,
                        timeout=30).json()
    gid, rids = opened["group_id"], opened["rollout_ids"]
    client = openai.OpenAI(base_url=served.v1, api_key=API_KEY, max_retries=0, timeout=60)
    for rid in rids:
        _two_turns(client, rid)
    before = _view(served, gid, include="tokens")["rollouts"][0]["trajectory"]
    assert before["turn_advantages"] is None
    assert [t["advantage"] for t in before["turns"]] == [None, None]
    r = httpx.post(f"{served.url}/v1/rewards", headers=AUTH, timeout=30, json=[
        {"rollout_id": rids[0], "reward": 1.0, "turn_rewards": [1.0, 0.0]},
        {"rollout_id": rids[1], "reward": 1.0, "turn_rewards": [0.0, 1.0]}])
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    while (view := _view(served, gid, include="tokens"))["state"] != "published":
        assert time.monotonic() < deadline, view["state"]
        time.sleep(0.05)
    early, late = (r["trajectory"] for r in view["rollouts"])
    assert early["advantage"] == late["advantage"] == 0.0
    assert early["turn_advantages"] == pytest.approx([0.0, -1.0], abs=1e-4)
    assert late["turn_advantages"] == pytest.approx([0.0, 1.0], abs=1e-4)
    assert [t["advantage"] for t in late["turns"]] == late["turn_advantages"]


def test_bad_include_is_a_422(served: Served) -> None:
    r = httpx.get(f"{served.url}/v1/groups/x", params={"include": "everything"}, headers=AUTH,
                  timeout=30)
    assert r.status_code == 422 and r.json()["error"]["message"]
