"""Per-task statistics over real HTTP (uvicorn, the hf engine on the tiny model, real Redis):
each group that ends updates its task's statistics once, whether the reward script ended it
(outcome-only rewards) or the Python rule (turn rewards); ``POST /v1/tasks/stats`` reads them;
bad queries are refused and change nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.helpers.serving import API_KEY, RedisKeys, Served

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def post(served: Served, path: str, body: Any) -> httpx.Response:
    return httpx.post(served.url + path, json=body, headers=AUTH, timeout=60)


def play(served: Served, task_id: str, rewards: list[float], turns: bool = False) -> None:
    r = post(served, "/v1/rollouts", {"prompt_token_ids": [1, 2], "max_tokens": 2,
                                      "n": len(rewards), "metadata": {"task_id": task_id}})
    assert r.status_code == 200, r.text
    items = [{"rollout_id": x["rollout_id"], "reward": v,
              **({"turn_rewards": [v]} if turns else {})}
             for x, v in zip(r.json()["rollouts"], rewards, strict=True)]
    r = post(served, "/v1/rewards", items)
    assert r.status_code == 200, r.text
    r = post(served, "/v1/rewards", items)  # a repeat: answered, not counted again
    assert r.status_code == 200, r.text


def stats(served: Served, *ids: str) -> dict[str, Any]:
    r = post(served, "/v1/tasks/stats", {"ids": list(ids)})
    assert r.status_code == 200, r.text
    return r.json()["stats"]


def test_each_ended_group_counts_once_in_its_tasks_statistics(served: Served) -> None:
    play(served, "t-solved", [1.0, 1.0])
    play(served, "t-solved", [1.0, 1.0], turns=True)  # ended by the Python rule
    play(served, "t-mixed", [0.0, 1.0])
    play(served, "t-mixed", [0.0, 0.0])
    out = stats(served, "t-solved", "t-mixed", "t-never")
    solved, mixed = out["t-solved"], out["t-mixed"]
    assert (solved["groups"], solved["no_signal"], solved["streak"]) == (2, 2, 2)
    assert solved["streak_value"] == 1.0 and solved["reward_ema"] == pytest.approx(1.0)
    assert (mixed["groups"], mixed["no_signal"], mixed["streak"]) == (2, 1, 1)
    assert mixed["reward_ema"] == pytest.approx(0.3 * 0.0 + 0.7 * 0.5)
    assert out["t-never"] is None
    play(served, "t-solved", [0.0, 1.0])  # a signal again: the streak ends
    assert stats(served, "t-solved")["t-solved"]["streak"] == 0


@pytest.mark.parametrize("body", [{"ids": []}, {"ids": ["x" * 300]}, {"ids": "t"},
                                  {"ids": ["a"], "more": 1}, {"ids": ["a"] * 1001}])
def test_bad_queries_are_refused_and_change_nothing(served: Served, rkeys: RedisKeys,
                                                    body: Any) -> None:
    before = rkeys.snapshot()
    r = post(served, "/v1/tasks/stats", body)
    assert r.status_code in (400, 422), r.text
    assert rkeys.snapshot() == before
