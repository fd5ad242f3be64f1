"""HTTP clients for the rollout server's native routes (rollouts, groups, rewards).

Chat completions go through the official ``openai`` client (see clients/examples); these
clients cover what the OpenAI API has no word for. Retries: connection errors, timeouts and
502/503/504 are retried with exponential backoff; 4xx never are. A 503 that holds a new group
back (``too_many_groups_in_flight``: the learner is behind, ``gspo_rl.server.rollouts.admission``;
or ``ready_queue_full``; ``training_finished``: the learner met its goal, a warning says so once a
minute) is backpressure, not a failure: it is retried after the server's
``Retry-After`` for as long as ``RetryPolicy.admission_patience_s`` allows (default: as long
as it takes), without using up ``attempts``. Rewards are idempotent on
the server (the same reward again is a 200 that changes nothing), so a retried reward post
whose first attempt did land is harmless.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from gspo_rl.client.errors import ServerUnavailable, error_for_status

_RETRY_STATUS = {502, 503, 504}
ADMISSION_CODES = frozenset({"too_many_groups_in_flight", "ready_queue_full",
                             "training_finished"})
FINISHED_CODE = "training_finished"
FINISHED_WARN_EVERY_S = 60.0
_MAX_RETRY_AFTER_S = 30.0
log = logging.getLogger("gspo_rl.client.client")


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


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter; ``attempts`` includes the first try."""

    attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    admission_patience_s: float | None = None
    """How long to keep retrying a request the server holds back for admission (503
    ``too_many_groups_in_flight`` / ``ready_queue_full``); None: as long as it takes."""

    def delays(self) -> Iterator[float]:
        for i in range(self.attempts - 1):
            yield min(self.max_delay_s, self.base_delay_s * 2**i) * (0.5 + random.random())


class _Attempts:
    """The retry state of one request: backoff delays for failures, a clock for admission."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.delays = policy.delays()
        self.started = time.monotonic()
        self.held = 0

    def admission_delay(self, resp: httpx.Response) -> float | None:
        """The wait before retrying a 503 that held a new group back; None: not such a 503,
        or out of patience."""
        if resp.status_code != 503:
            return None
        try:
            code = resp.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return None
        patience = self.policy.admission_patience_s
        if code not in ADMISSION_CODES or (
                patience is not None and time.monotonic() - self.started > patience):
            return None
        self.held += 1
        if code == FINISHED_CODE:
            _warn_finished(_error_message(resp))
        elif self.held % 10 == 1:
            log.info("server holds new groups back (%s): retrying", code)
        try:
            after = float(resp.headers.get("Retry-After", "1"))
        except ValueError:
            after = 1.0
        return min(_MAX_RETRY_AFTER_S, max(0.05, after)) * (0.75 + 0.5 * random.random())


_finished_warned_at = -math.inf


def _warn_finished(message: str) -> None:
    """Once a minute per process, whatever the number of requests waiting."""
    global _finished_warned_at
    now = time.monotonic()
    if now - _finished_warned_at >= FINISHED_WARN_EVERY_S:
        _finished_warned_at = now
        log.warning("%s: waiting for a learner to start again", message)


def _error_message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]


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


def _parse(resp: httpx.Response) -> Any:
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    if resp.status_code >= 400:
        raise error_for_status(resp.status_code, body)
    return body


_Outcome = httpx.Response | httpx.TransportError


def _after_attempt(outcome: _Outcome, attempts: _Attempts,
                   what: str) -> tuple[Any, float | None]:
    """The retry policy, shared by the sync and async clients: ``(body, None)`` when the
    attempt is final (a 4xx raises its error), ``(None, delay)`` to wait and try again (an
    admission 503 while patience lasts; a 502/503/504 or a transport error while the
    backoff delays last), ``ServerUnavailable`` after."""
    if isinstance(outcome, httpx.Response):
        if outcome.status_code not in _RETRY_STATUS:
            return _parse(outcome), None
        held = attempts.admission_delay(outcome)
        if held is not None:
            return None, held
        err: Exception = error_for_status(outcome.status_code, outcome.text)
    else:
        err = outcome
    delay = next(attempts.delays, None)
    if delay is None:
        raise ServerUnavailable(f"{what} failed after retries: {err}") from err
    return None, delay


class GSPOClient:
    """Synchronous client. ``api_key`` is the server's ``/v1`` Bearer key, if it has one."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 120.0,
                 retry: RetryPolicy = RetryPolicy()) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def _request(self, method: str, path: str, json: Any = None) -> Any:
        attempts = _Attempts(self.retry)
        while True:
            try:
                outcome: _Outcome = self.http.request(method, path, json=json)
            except httpx.TransportError as exc:
                outcome = exc
            body, delay = _after_attempt(outcome, attempts, f"{method} {path}")
            if delay is None:
                return body
            time.sleep(delay)

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health")

    def rollouts(self, *, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
                 prompt_token_ids: list[int] | None = None, n: int = 8,
                 metadata: dict[str, Any] | None = None, **sampling: Any) -> RolloutGroup:
        """Sample ``n`` completions of one prompt as one group (``POST /v1/rollouts``)."""
        body = _rollouts_body(prompt, messages, prompt_token_ids, n, metadata, sampling)
        return RolloutGroup.from_json(self._request("POST", "/v1/rollouts", body))

    def open_group(self, size: int, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Open ``size`` multi-turn episodes (``POST /v1/groups``): group_id and rollout_ids."""
        return self._request("POST", "/v1/groups", {"size": size, "metadata": metadata or {}})

    def post_reward(self, rollout_id: str, reward: float,
                    turn_rewards: Sequence[float] | None = None) -> Any:
        return self.post_rewards([{"rollout_id": rollout_id, "reward": reward,
                                   "turn_rewards": turn_rewards}])

    def post_rewards(self, rewards: Sequence[dict[str, Any]]) -> Any:
        """Post several rewards in one call; safe to retry (idempotent on the server)."""
        return self._request("POST", "/v1/rewards", _reward_items(rewards))

    def group(self, group_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/groups/{group_id}")

    def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the served model (its ``id`` is what requests pass as model)."""
        return self._request("GET", "/v1/models")["data"]

    def post_eval(self, name: str, policy_version: int, metrics: dict[str, float],
                  metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """``POST /v1/evals``: an evaluation's result, for the learner to log."""
        return self._request("POST", "/v1/evals",
                             _eval_body(name, policy_version, metrics, metadata))

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

    async def _request(self, method: str, path: str, json: Any = None) -> Any:
        attempts = _Attempts(self.retry)
        while True:
            try:
                outcome: _Outcome = await self.http.request(method, path, json=json)
            except httpx.TransportError as exc:
                outcome = exc
            body, delay = _after_attempt(outcome, attempts, f"{method} {path}")
            if delay is None:
                return body
            await asyncio.sleep(delay)

    async def health(self) -> dict[str, Any]:
        return await self._request("GET", "/health")

    async def rollouts(self, *, prompt: str | None = None,
                       messages: list[dict[str, Any]] | None = None,
                       prompt_token_ids: list[int] | None = None, n: int = 8,
                       metadata: dict[str, Any] | None = None, **sampling: Any) -> RolloutGroup:
        body = _rollouts_body(prompt, messages, prompt_token_ids, n, metadata, sampling)
        return RolloutGroup.from_json(await self._request("POST", "/v1/rollouts", body))

    async def open_group(self, size: int,
                         metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._request("POST", "/v1/groups",
                                   {"size": size, "metadata": metadata or {}})

    async def post_rewards(self, rewards: Sequence[dict[str, Any]]) -> Any:
        return await self._request("POST", "/v1/rewards", _reward_items(rewards))

    async def post_reward(self, rollout_id: str, reward: float,
                          turn_rewards: Sequence[float] | None = None) -> Any:
        return await self.post_rewards([{"rollout_id": rollout_id, "reward": reward,
                                         "turn_rewards": turn_rewards}])

    async def group(self, group_id: str) -> dict[str, Any]:
        return await self._request("GET", f"/v1/groups/{group_id}")

    async def models(self) -> list[dict[str, Any]]:
        return (await self._request("GET", "/v1/models"))["data"]

    async def post_eval(self, name: str, policy_version: int, metrics: dict[str, float],
                        metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self._request("POST", "/v1/evals",
                                   _eval_body(name, policy_version, metrics, metadata))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncGSPOClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
