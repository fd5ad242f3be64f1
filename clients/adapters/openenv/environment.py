"""``OpenEnvEnvironment``: an OpenEnv server's episodes as a gspo multi-turn environment, and
``load``, which builds one (the package docstring describes the episode).

``load(target, args)`` validates the settings (``args``), reads the server's schema
(``client``), settles the action and observation format (``codec``) and opens ``group_size``
sessions at once (``probe``), refusing with a ``ValueError`` a server that is unreachable,
unfit or too small for a group. An episode holds one session of the server for its whole
length and closes it on every exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from openai import AsyncOpenAI

from gspo_rl.client.adapters.chat import chat_reply
from gspo_rl.client.adapters.openenv.args import OpenEnvArgs, parse_args
from gspo_rl.client.adapters.openenv.client import (
    CAPACITY,
    INVALID,
    EnvServerError,
    client_class,
    fetch_schema,
    server_url,
)
from gspo_rl.client.adapters.openenv.codec import (
    ActionCodec,
    InvalidAction,
    render,
    resolve_action,
    resolve_observation,
)
from gspo_rl.client.environment import EpisodeResult, EpisodeSession, MultiTurnEnvironment

log = logging.getLogger(__name__)
T = TypeVar("T")

SAMPLING = {"temperature": 1.0, "max_tokens": 64}
SEEDS = 2**31
PROBE_WAIT_S = 2.0
"""``load``'s sessions wait this long for the server's capacity (sessions closed just before
may still count there)."""


@dataclass
class Turn:
    """What one reply did: its reward, whether the episode ended, the next user message."""

    reward: float
    done: bool
    text: str
    valid: bool = True


class OpenEnvSession:
    """One session of the server (its own environment instance), reset, driven with text."""

    def __init__(self, env: OpenEnvEnvironment, client: Any, first: Any) -> None:
        self.env, self.client = env, client
        self.observation: Any = first.observation
        """The latest observation (a dict): the reset's, then each step's."""
        self.first = env.render(first.observation)
        """The reset's observation as the first user message."""

    async def act(self, text: str) -> Turn:
        """The model's reply as one step: the step's reward, ``done`` and observation text;
        an invalid action steps nothing (``Turn.valid`` False, the reason as the text)."""
        try:
            result = await self.client.step(self.env.codec.encode(text))
        except InvalidAction as exc:
            return self.env.invalid(str(exc))
        except EnvServerError as exc:
            if exc.code != INVALID:
                raise
            return self.env.invalid(exc.detail)
        self.observation = result.observation
        reward = 0.0 if result.reward is None else float(result.reward)
        return Turn(reward, bool(result.done), self.env.render(result.observation))


class OpenEnvEnvironment(MultiTurnEnvironment):
    """An OpenEnv server's episodes, played by the policy (package docstring). A task is the
    seed of a group's resets."""

    def __init__(self, url: str, args: OpenEnvArgs, codec: ActionCodec,
                 observation_field: str | None) -> None:
        self.url, self.args, self.codec = url, args, codec
        self.observation_field = observation_field
        self.group_size = args.group_size
        self.name = urlsplit(url).netloc + urlsplit(url).path
        self.sampling = {**SAMPLING, **args.sampling}
        self.system_prompt = args.system_prompt or codec.system_prompt()
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def sample_task(self, rng: random.Random) -> int:
        seed = self.args.seed
        return seed if type(seed) is int else rng.randrange(SEEDS)

    def group_metadata(self, task: int) -> dict[str, Any]:
        return {"source": "openenv", "task_id": f"{self.name}/{task}"}

    def render(self, observation: Any) -> str:
        return render(observation, self.observation_field)

    def invalid(self, reason: str) -> Turn:
        return Turn(-self.args.invalid_penalty, False,
                    f"Invalid action: {reason[:500]}. {self.codec.hint()}", valid=False)

    async def episode(self, task: int, session: EpisodeSession) -> EpisodeResult:
        return await self.play(task, session)

    async def play(self, task: int, session: EpisodeSession) -> EpisodeResult:
        """One episode, counted nowhere (an evaluation plays it with an unrecorded session)."""
        seed = None if self.args.seed is False else task
        episode_id = session.rollout_id if session.record else None
        async with self.session(seed, episode_id) as env, AsyncOpenAI(
                base_url=session.openai_base_url, api_key=session.api_key or "unused",
                timeout=self.args.timeout_s, max_retries=2) as llm:
            rewards = await self._turns(env, llm, session)
        total = sum(rewards) if self.args.reward == "sum" else rewards[-1]
        return EpisodeResult(reward=total, turn_rewards=rewards)

    async def _turns(self, env: OpenEnvSession, llm: AsyncOpenAI,
                     session: EpisodeSession) -> list[float]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": env.first}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        rewards: list[float] = []
        for _ in range(self.args.max_turns):
            text, assistant = await chat_reply(llm, messages, session, self.sampling)
            messages.append(assistant)
            turn = await env.act(text)
            rewards.append(turn.reward)
            if turn.done:
                break
            messages.append({"role": "user", "content": turn.text})
        return rewards

    @contextlib.asynccontextmanager
    async def session(self, seed: int | None = None,
                      episode_id: str | None = None) -> AsyncIterator[OpenEnvSession]:
        """A session of the server, reset with ``seed`` and ``episode_id`` (None: not sent);
        waits up to ``session_wait_s`` while the server is at capacity."""
        async with self._gate():
            client, first = await self._open(reset_kwargs(seed, episode_id),
                                             self.args.session_wait_s)
            try:
                if first.done:
                    raise RuntimeError(f"openenv: {self.url}'s reset ended the episode at once")
                yield OpenEnvSession(self, client, first)
            finally:
                await client.close()

    def _gate(self) -> contextlib.AbstractAsyncContextManager[Any]:
        if self.args.max_sessions is None:
            return contextlib.nullcontext()
        loop = asyncio.get_running_loop()  # a semaphore serves one event loop
        if self._semaphore is None or self._gate_loop is not loop:
            self._gate_loop, self._semaphore = loop, asyncio.Semaphore(self.args.max_sessions)
        return self._semaphore

    async def _open(self, reset: dict[str, Any], wait_s: float) -> tuple[Any, Any]:
        """A connected client and its reset's result, retried while the server is full."""
        deadline, delay = time.monotonic() + wait_s, 0.05
        while True:
            client = client_class()(base_url=self.url, message_timeout_s=self.args.timeout_s)
            try:
                return client, await client.reset(**reset)
            except EnvServerError as exc:
                await client.close()
                if exc.code != CAPACITY or time.monotonic() + delay > deadline:
                    raise
            except BaseException:
                await client.close()
                raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    async def probe(self, n: int) -> list[Any]:
        """Open ``n`` sessions at once (each waits ``PROBE_WAIT_S`` at most), each reset with
        the probe's seed: the reset results, or the errors."""
        seed = None if self.args.seed is False else self.sample_task(random.Random(0))

        async def one(stack: contextlib.AsyncExitStack) -> Any:
            client, first = await self._open(reset_kwargs(seed, None), PROBE_WAIT_S)
            stack.push_async_callback(client.close)
            return first

        async with contextlib.AsyncExitStack() as stack:
            return await asyncio.gather(*(one(stack) for _ in range(n)),
                                        return_exceptions=True)


def reset_kwargs(seed: int | None, episode_id: str | None) -> dict[str, Any]:
    """What a reset sends (a server passes on what its environment's ``reset`` takes)."""
    kwargs: dict[str, Any] = {"seed": seed, "episode_id": episode_id}
    return {k: v for k, v in kwargs.items() if v is not None}


def check_sessions(env: OpenEnvEnvironment, results: list[Any]) -> None:
    """Refuse a server that did not open the probe's sessions; warn when resets with one seed
    gave different observations (the environment ignores seeds)."""
    failed = [r for r in results if isinstance(r, BaseException)]
    if any(not (isinstance(e, EnvServerError) and e.code == CAPACITY) for e in failed):
        error = next(e for e in failed if not isinstance(e, EnvServerError)
                     or e.code != CAPACITY)
        raise ValueError(f"openenv: a session of {env.url} failed: {error!r}") from error
    if failed:
        k, n = len(results) - len(failed), len(results)
        raise ValueError(
            f"openenv: {env.url} opened {k} of {n} sessions at once: it holds {k} (its "
            f"max_concurrent_envs; more need SUPPORTS_CONCURRENT_SESSIONS), and a group plays "
            f"its {env.group_size} episodes together. Start it with max_concurrent_envs >= "
            f"group_size x concurrency, or pass max_sessions={max(k, 1)} (episodes queue)")
    if any(r.done for r in results):
        raise ValueError(f"openenv: {env.url}'s reset ended the episode at once (done)")
    seen = {json.dumps(r.observation, sort_keys=True, default=str) for r in results}
    if env.args.seed is not False and len(seen) > 1:
        log.warning("openenv: %s gave different first observations for one seed: its reset "
                    "ignores seeds (or is random), so a group's episodes play different "
                    "tasks; seed=false says so", env.url)


def run_blocking(make: Callable[[], Awaitable[T]]) -> T:
    """``make()`` to completion from sync code, in a thread when a loop already runs here."""

    async def main() -> T:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


def load(target: str, args: dict[str, Any]) -> OpenEnvEnvironment:
    """The OpenEnv server at ``target`` (its base URL) as a multi-turn environment; refused
    with a ValueError when unreachable, unfit or too small for a group (package docstring)."""
    settings = parse_args(args)
    client_class()  # AdapterUnavailable without openenv-core
    url = server_url(target)
    schema = fetch_schema(url)
    codec = resolve_action(schema["action"], settings.action_format, settings.action_field)
    observed = resolve_observation(schema["observation"], settings.observation_field)
    env = OpenEnvEnvironment(url, settings, codec, observed)
    n = min(settings.group_size, settings.max_sessions or settings.group_size)
    check_sessions(env, run_blocking(lambda: env.probe(n)))
    return env
