"""HTTP clients for the rollout server's native routes (rollouts, groups, rewards).

Chat completions go through the official ``openai`` client (see clients/examples); these
clients cover what the OpenAI API has no word for. Retries (``gspo_rl.client.retry``):
connection errors, timeouts and 502/503/504 are retried with exponential backoff; 4xx never
are; a 503 that holds a new group back is waited out (admission). Rewards and abandoning a
group are idempotent on the server (the same reward again is a 200 that changes nothing), so
they are retried through a server restart (``RetryPolicy.outage_patience_s``): a reward lost
to a restart would leave its group open, holding admission capacity, until its deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

import httpx

from gspo_rl.client.retry import Attempts, Outcome, RetryPolicy, after_attempt

__all__ = ["AsyncGSPOClient", "GSPOClient", "RetryPolicy", "Rollout", "RolloutGroup"]


@dataclass
class Rollout:
    """One sampled completion of a group (``rollout_id`` None: not recorded)."""

    rollout_id: str | None
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int = 0


@dataclass
class RolloutGroup:
    """The answer to ``POST /v1/rollouts``: ``n`` samples of one prompt (``group_id`` None:
    sampled with ``record=False``, nothing recorded)."""

    group_id: str | None
    rollouts: list[Rollout]
    prompt_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RolloutGroup:
        rollouts = [Rollout(rollout_id=r["rollout_id"], text=r.get("text", ""),
                            token_ids=r.get("token_ids", []), logprobs=r.get("logprobs", []),
                            finish_reason=r.get("finish_reason", ""),
                            policy_version=int(r.get("policy_version", 0)))
                    for r in d["rollouts"]]
        return cls(group_id=d["group_id"], rollouts=rollouts,
                   prompt_token_ids=d.get("prompt_token_ids", []))


def _reward_items(rewards: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    items = []
    for r in rewards:
        item = {"rollout_id": r["rollout_id"], "reward": float(r["reward"])}
        if r.get("turn_rewards") is not None:
            item["turn_rewards"] = [float(x) for x in r["turn_rewards"]]
        items.append(item)
    return items


def _rollouts_body(prompt: str | None, messages: list[dict[str, Any]] | None,
                   prompt_token_ids: list[int] | None, n: int,
                   metadata: dict[str, Any] | None, sampling: dict[str, Any]) -> dict[str, Any]:
    given = [x is not None for x in (prompt, messages, prompt_token_ids)]
    if sum(given) != 1:
        raise ValueError("give exactly one of prompt, messages, prompt_token_ids")
    body: dict[str, Any] = {"n": n, **sampling}
    if prompt is not None:
        body["prompt"] = prompt
    elif messages is not None:
        body["messages"] = messages
    else:
        body["prompt_token_ids"] = prompt_token_ids
    if metadata:
        body["metadata"] = metadata
    return body


def _eval_body(name: str, policy_version: int, metrics: dict[str, float],
               metadata: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "policy_version": int(policy_version),
                            "metrics": {k: float(v) for k, v in metrics.items()}}
    if metadata:
        body["metadata"] = metadata
    return body


class GSPOClient:
    """Synchronous client. ``api_key`` is the server's ``/v1`` Bearer key, if it has one."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 120.0,
                 retry: RetryPolicy = RetryPolicy()) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def _request(self, method: str, path: str, json: Any = None,
                 patient: bool = False) -> Any:
        attempts = Attempts(self.retry, f"{method} {path}", patient)
        while True:
            try:
                outcome: Outcome = self.http.request(method, path, json=json)
            except httpx.TransportError as exc:
                outcome = exc
            body, delay = after_attempt(outcome, attempts)
            if delay is None:
                return body
            time.sleep(delay)

    def health(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self._request("GET", "/health"))

    def rollouts(self, *, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
                 prompt_token_ids: list[int] | None = None, n: int = 8,
                 metadata: dict[str, Any] | None = None, **sampling: Any) -> RolloutGroup:
        """Sample ``n`` completions of one prompt as one group (``POST /v1/rollouts``)."""
        body = _rollouts_body(prompt, messages, prompt_token_ids, n, metadata, sampling)
        return RolloutGroup.from_json(self._request("POST", "/v1/rollouts", body))

    def open_group(self, size: int, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Open ``size`` multi-turn episodes (``POST /v1/groups``): group_id and rollout_ids."""
        return cast("dict[str, Any]",
                    self._request("POST", "/v1/groups", {"size": size, "metadata": metadata or {}}))

    def post_reward(self, rollout_id: str, reward: float,
                    turn_rewards: Sequence[float] | None = None) -> Any:
        return self.post_rewards([{"rollout_id": rollout_id, "reward": reward,
                                   "turn_rewards": turn_rewards}])

    def post_rewards(self, rewards: Sequence[dict[str, Any]]) -> Any:
        """Post several rewards in one call; idempotent on the server, so retried through a
        server restart (``RetryPolicy.outage_patience_s``)."""
        return self._request("POST", "/v1/rewards", _reward_items(rewards), patient=True)

    def abandon_group(self, group_id: str) -> dict[str, Any]:
        """Give a group up (``POST /v1/groups/{id}/abandon``): it stops holding admission
        capacity at once, published with the rewards it has when it has enough of them, else
        dropped. Idempotent; retried through a server restart."""
        return cast("dict[str, Any]", self._request(
            "POST", f"/v1/groups/{quote(group_id, safe='')}/abandon", patient=True))

    def task_stats(self, task_ids: Sequence[str]) -> dict[str, dict[str, Any] | None]:
        """How each task's recent groups ended (``POST /v1/tasks/stats``: groups, no_signal,
        streak, streak_value, reward_ema; None: no group of it has ended yet)."""
        return cast("dict[str, dict[str, Any] | None]",
                    self._request("POST", "/v1/tasks/stats", {"ids": list(task_ids)})["stats"])

    def group(self, group_id: str, include: str | None = None) -> dict[str, Any]:
        """``GET /v1/groups/{id}``: its state and rewards; ``include="tokens"``: also each
        rollout's trajectory (tokens, turns with their text, advantages once published)."""
        query = f"?include={include}" if include else ""
        return cast("dict[str, Any]",
                    self._request("GET", f"/v1/groups/{quote(group_id, safe='')}{query}"))

    def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the served model (its ``id`` is what requests pass as model)."""
        return cast("list[dict[str, Any]]", self._request("GET", "/v1/models")["data"])

    def post_eval(self, name: str, policy_version: int, metrics: dict[str, float],
                  metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """``POST /v1/evals``: an evaluation's result, for the learner to log."""
        return cast("dict[str, Any]", self._request(
            "POST", "/v1/evals", _eval_body(name, policy_version, metrics, metadata)))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> GSPOClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncGSPOClient:
    """The asyncio twin of ``GSPOClient``: same methods, awaitable."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 120.0,
                 retry: RetryPolicy = RetryPolicy(), max_connections: int = 64) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.retry = retry
        limits = httpx.Limits(max_connections=max_connections)
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout_s,
                                      limits=limits)

    async def _request(self, method: str, path: str, json: Any = None,
                       patient: bool = False) -> Any:
        attempts = Attempts(self.retry, f"{method} {path}", patient)
        while True:
            try:
                outcome: Outcome = await self.http.request(method, path, json=json)
            except httpx.TransportError as exc:
                outcome = exc
            body, delay = after_attempt(outcome, attempts)
            if delay is None:
                return body
            await asyncio.sleep(delay)

    async def health(self) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._request("GET", "/health"))

    async def rollouts(self, *, prompt: str | None = None,
                       messages: list[dict[str, Any]] | None = None,
                       prompt_token_ids: list[int] | None = None, n: int = 8,
                       metadata: dict[str, Any] | None = None, **sampling: Any) -> RolloutGroup:
        body = _rollouts_body(prompt, messages, prompt_token_ids, n, metadata, sampling)
        return RolloutGroup.from_json(await self._request("POST", "/v1/rollouts", body))

    async def open_group(self, size: int,
                         metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._request(
            "POST", "/v1/groups", {"size": size, "metadata": metadata or {}}))

    async def post_rewards(self, rewards: Sequence[dict[str, Any]]) -> Any:
        return await self._request("POST", "/v1/rewards", _reward_items(rewards),
                                   patient=True)

    async def abandon_group(self, group_id: str) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._request(
            "POST", f"/v1/groups/{quote(group_id, safe='')}/abandon", patient=True))

    async def task_stats(self, task_ids: Sequence[str]) -> dict[str, dict[str, Any] | None]:
        """Each task's statistics (``POST /v1/tasks/stats``; None: none yet)."""
        return cast("dict[str, dict[str, Any] | None]", (await self._request(
            "POST", "/v1/tasks/stats", {"ids": list(task_ids)}))["stats"])

    async def post_reward(self, rollout_id: str, reward: float,
                          turn_rewards: Sequence[float] | None = None) -> Any:
        return await self.post_rewards([{"rollout_id": rollout_id, "reward": reward,
                                         "turn_rewards": turn_rewards}])

    async def group(self, group_id: str, include: str | None = None) -> dict[str, Any]:
        query = f"?include={include}" if include else ""
        return cast("dict[str, Any]",
                    await self._request("GET", f"/v1/groups/{quote(group_id, safe='')}{query}"))

    async def models(self) -> list[dict[str, Any]]:
        return cast("list[dict[str, Any]]", (await self._request("GET", "/v1/models"))["data"])

    async def post_eval(self, name: str, policy_version: int, metrics: dict[str, float],
                        metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._request(
            "POST", "/v1/evals", _eval_body(name, policy_version, metrics, metadata)))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncGSPOClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
