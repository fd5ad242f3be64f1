"""OpenEnv environment servers (``openenv-core``) as multi-turn environments: ``openenv:URL``.

``load(target, args)``: ``target`` is the server's base URL (``http://127.0.0.1:8001``; https,
ws and wss too). Sessions go through openenv-core's own ``GenericEnvClient`` (its WebSocket
``/ws``: one connection is one session with its own environment instance on the server; the
HTTP ``/reset`` and ``/step`` routes build a fresh instance per call, so they cannot hold an
episode). No environment package is imported here: a typed-client spec
(``module:ClientClass@URL``) is refused, since a typed client only converts the same JSON that
the server's ``/schema`` describes. ``load`` reads ``/schema``, settles how text becomes an
action and which observation text the model reads, and opens ``group_size`` sessions at once
(a reset each): a server that cannot be reached, whose schema does not fit, or that holds fewer
sessions (``max_concurrent_envs``) is refused with a ``ValueError``.

An episode resets its own session (the group's seed, so that the G episodes of a group play
one task; ``episode_id``: the rollout id), shows the observation as the user message, asks the
rollout server for the next assistant message (``session.extra_body`` on every call, the whole
conversation each time), turns the text into an action (one field's value, or a JSON object),
steps, and repeats until ``done`` or ``max_turns``. ``turn_rewards``: one per chat completion,
the step's reward (None counts 0.0); an invalid action (no JSON object, or refused by the
server's action model) steps nothing, earns ``-invalid_penalty`` and gets the error as the next
user message. The reward: the sum of ``turn_rewards`` (``reward="sum"``) or the last one. Any
other error of the server fails the episode. Guide: docs/environments/openenv.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import httpx
from openai import AsyncOpenAI
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gspo_rl.client.adapters import missing
from gspo_rl.client.environment import EpisodeResult, EpisodeSession, MultiTurnEnvironment

log = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMES = ("http://", "https://", "ws://", "wss://")
ACTION_BASE = frozenset({"metadata"})  # openenv's Action base field
OBSERVATION_BASE = frozenset({"done", "reward", "metadata"})  # sent beside the observation
OBSERVATION_FIELDS = ("prompt", "message", "text", "echoed_message", "content", "observation",
                      "output", "feedback", "response")
"""The observation's text, by default: the first of these string fields it has."""
SAMPLING = {"temperature": 1.0, "max_tokens": 64}
OPENAI_KEYS = frozenset({"temperature", "top_p", "max_tokens", "max_completion_tokens", "stop",
                         "seed", "frequency_penalty", "presence_penalty", "logprobs",
                         "top_logprobs"})
"""Sampling keys the openai client takes as arguments; the others go in ``extra_body``."""
CAPACITY, INVALID = "CAPACITY_REACHED", "VALIDATION_ERROR"  # openenv's WSErrorCode values
SEEDS = 2**31
CLOSE_WAIT_S = 5.0
PROBE_WAIT_S = 2.0
"""``load``'s sessions wait this long for the server's capacity (sessions closed just before
may still count there)."""
_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


class OpenEnvArgs(BaseModel):
    """The ``--env-arg`` settings of an ``openenv:`` environment."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(4, ge=1)
    """Episodes per group, each in its own session of the server."""
    max_turns: int = Field(8, ge=1)
    """Chat completions per episode at most; an episode not done by then ends there."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Over ``SAMPLING``; keys the openai client lacks (top_k, min_p) go in ``extra_body``."""
    system_prompt: str | None = None
    """The first message; default: none for text actions, the action schema for JSON ones."""
    action_format: Literal["auto", "text", "json"] = "auto"
    """text: the reply is ``action_field``'s value; json: a JSON object of the action; auto:
    text when the action has one string field and requires no other, else json."""
    action_field: str | None = None
    """The action field the reply fills (text actions); default: its only string field."""
    observation_field: str | None = None
    """The observation field shown to the model; default: ``OBSERVATION_FIELDS``' first, else
    the whole observation as JSON."""
    reward: Literal["sum", "last"] = "sum"
    """The episode's reward: the sum of its turn rewards, or the last one."""
    seed: bool | int = True
    """true: each group's seed (drawn from the run's seed) goes to every reset of the group;
    false: no seed is sent (the server picks, episodes of a group may differ); an int: every
    group resets with this seed."""
    invalid_penalty: float = Field(0.1, ge=0.0)
    """An invalid action's turn reward is ``-invalid_penalty``."""
    max_sessions: int | None = Field(None, ge=1)
    """Sessions held at once by this environment at most (episodes beyond wait); default: no
    limit here, the server's applies (an episode waits ``session_wait_s`` for a free one)."""
    session_wait_s: float = Field(60.0, gt=0.0)
    """How long an episode waits for a session while the server is at capacity."""
    timeout_s: float = Field(120.0, gt=0.0)
    """Time limit of one chat completion, of one reply of the environment server."""

    @field_validator("seed")
    @classmethod
    def _seed_not_negative(cls, seed: bool | int) -> bool | int:
        if type(seed) is int and seed < 0:
            raise ValueError(f"seed must be true, false or an int >= 0, not {seed}")
        return seed


class InvalidAction(ValueError):
    """The model's reply is no action of this environment: a turn, not a crash."""


class EnvServerError(RuntimeError):
    """An error reply of the environment server; ``code``: openenv's ``WSErrorCode``."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.code = str(data.get("code", "UNKNOWN"))
        errors = data.get("errors") or []
        self.detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}".lstrip(": ")
            for e in errors if isinstance(e, dict)) or str(data.get("message", "error"))
        super().__init__(f"{data.get('message', 'error')} (code: {self.code}): {self.detail}")


@functools.cache
def _client_class() -> type:
    """openenv's dict client, its server errors raised as ``EnvServerError`` (with codes)."""
    try:
        from openenv.core.generic_client import GenericEnvClient
        from websockets.exceptions import ConnectionClosed
    except ImportError as exc:
        raise missing("openenv", exc) from exc

    class SessionClient(GenericEnvClient):
        async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
            with contextlib.suppress(ConnectionClosed):  # a refusal may close it: read it
                await self._send(message)
            response = await self._receive()
            if response.get("type") == "error":
                raise EnvServerError(response.get("data") or {})
            return response

        async def disconnect(self) -> None:
            if self._ws is not None:  # let the server close: it fails to close a closed socket
                with contextlib.suppress(Exception):
                    await self._send({"type": "close"})
                    await asyncio.wait_for(self._ws.wait_closed(), CLOSE_WAIT_S)
            await super().disconnect()

    return SessionClient


def is_string(prop: dict[str, Any]) -> bool:
    """Whether a JSON-schema property takes a string (``Optional[str]`` included)."""
    if prop.get("type") == "string":
        return True
    return any(is_string(p) for p in [*prop.get("anyOf", ()), *prop.get("oneOf", ())]
               if isinstance(p, dict))


def schema_fields(schema: Any, what: str, base: frozenset[str]) -> dict[str, dict[str, Any]]:
    """The properties of the ``what`` schema, the openenv base fields left out."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        raise ValueError(f"openenv: the server's {what} schema has no properties: {schema!r}")
    return {k: v for k, v in props.items() if k not in base and isinstance(v, dict)}


@dataclass(frozen=True)
class ActionCodec:
    """How the model's text becomes an action: ``field``'s value, or (``field`` None) a JSON
    object, validated by the server against its action model (``schema``)."""

    field: str | None
    schema: dict[str, Any]

    def encode(self, text: str) -> dict[str, Any]:
        return {self.field: text} if self.field is not None else parse_json_action(text)

    def hint(self) -> str:
        if self.field is not None:
            return f"Reply with a valid {self.field}."
        return "Reply with one JSON object: the action, matching its JSON schema."

    def system_prompt(self) -> str | None:
        if self.field is not None:
            return None
        fields = {k: v for k, v in self.schema.get("properties", {}).items()
                  if k not in ACTION_BASE}
        shown = {**self.schema, "properties": fields}
        return ("Reply to every message with one JSON object, your action, matching this "
                f"JSON schema:\n{json.dumps(shown, separators=(',', ':'))}")


def parse_json_action(text: str) -> dict[str, Any]:
    """The JSON object in a reply (a fenced block, else from the first ``{`` to the last
    ``}``); ``InvalidAction`` when there is none or it does not parse."""
    fenced = _FENCE.search(text)
    start, end = text.find("{"), text.rfind("}")
    if fenced is None and start < 0:
        raise InvalidAction("no JSON object in the reply")
    body = fenced.group(1) if fenced else text[start:end + 1 if end > start else len(text)]
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidAction(f"not valid JSON ({exc.msg}, char {exc.pos})") from None
    if not isinstance(value, dict):
        raise InvalidAction("the action must be a JSON object")
    return value


def resolve_action(schema: Any, fmt: str, field: str | None) -> ActionCodec:
    """The codec ``action_format`` and ``action_field`` ask for; ValueError when the action
    schema does not allow it."""
    fields = schema_fields(schema, "action", ACTION_BASE)
    if not fields:
        raise ValueError("openenv: the server's action has no field for the model's reply")
    required = set(schema.get("required", ())) - ACTION_BASE
    if fmt == "json":
        if field is not None:
            raise ValueError("openenv: action_field goes with action_format=text, not json")
        return ActionCodec(None, schema)
    if field is None:
        strings = [k for k, p in fields.items() if is_string(p)]
        if len(strings) == 1 and required <= set(strings):
            field = strings[0]
        elif fmt == "text":
            raise ValueError("openenv: action_format=text needs action_field: the action "
                             f"has fields {sorted(fields)}, not one string field")
        else:
            return ActionCodec(None, schema)
    if field not in fields:
        raise ValueError(f"openenv: action_field {field!r} is not a field of the server's "
                         f"action (its fields: {', '.join(sorted(fields))})")
    if required - {field}:
        raise ValueError(f"openenv: the action also requires {sorted(required - {field})}; "
                         "text fills one field: use action_format=json")
    return ActionCodec(field, schema)


def resolve_observation(schema: Any, field: str | None) -> str | None:
    """The observation field the model reads (None: the whole observation as JSON)."""
    fields = schema_fields(schema, "observation", OBSERVATION_BASE)
    if field is not None:
        if field not in fields:
            raise ValueError(f"openenv: observation_field {field!r} is not a field of the "
                             f"server's observation (its fields: {', '.join(sorted(fields))})")
        return field
    return next((k for k in OBSERVATION_FIELDS if k in fields and is_string(fields[k])), None)


def render(observation: Any, field: str | None) -> str:
    """The user message of an observation: ``field``'s text, else the observation as JSON."""
    if field is None:
        return json.dumps(observation, ensure_ascii=False, default=str)
    if not isinstance(observation, dict) or field not in observation:
        raise ValueError(f"openenv: the observation has no {field!r}: {observation!r}"[:500])
    value = observation[field]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def server_url(target: str) -> str:
    """The server's base URL from the spec's target; ValueError for anything else."""
    if "@" in target and not target.startswith(SCHEMES):
        raise ValueError(f"openenv: {target!r}: typed clients (module:Class@URL) are not "
                         "needed: the adapter speaks openenv's JSON through GenericEnvClient "
                         "and reads the action schema from the server; pass the URL alone")
    parts = urlsplit(target)
    if not target.startswith(SCHEMES) or not parts.netloc:
        raise ValueError(f"openenv: {target!r} is not a server URL: start the environment "
                         "server (e.g. `uvicorn server.app:app --port 8001`, or its Docker "
                         "image) and pass openenv:http://HOST:PORT")
    return target.rstrip("/")


def fetch_schema(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The server's ``/schema`` (action, observation, state); ValueError when unreachable or
    not an OpenEnv server."""
    http = re.sub(r"^ws", "http", url)
    try:
        r = httpx.get(f"{http}/schema", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ValueError(f"openenv: cannot reach the environment server at {url} ({exc!r}): "
                         "is it running?") from None
    try:
        body = r.json() if r.status_code == 200 else None
    except ValueError:
        body = None
    if not isinstance(body, dict) or not all(isinstance(body.get(k), dict)
                                             for k in ("action", "observation")):
        raise ValueError(f"openenv: {http}/schema answered {r.status_code} "
                         f"{r.text[:200]!r}: not an OpenEnv environment server (those serve "
                         "their action and observation schemas there)")
    return body


def parse_args(args: dict[str, Any]) -> OpenEnvArgs:
    try:
        return OpenEnvArgs.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'args'}: {e['msg']}"
                             for e in exc.errors())
        raise ValueError(f"openenv: bad --env-arg ({problems})") from None


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
    """An OpenEnv server's episodes, played by the policy (module docstring). A task is the
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
            text, assistant = await self._reply(llm, messages, session)
            messages.append(assistant)
            turn = await env.act(text)
            rewards.append(turn.reward)
            if turn.done:
                break
            messages.append({"role": "user", "content": turn.text})
        return rewards

    async def _reply(self, llm: AsyncOpenAI, messages: list[dict[str, Any]],
                     session: EpisodeSession) -> tuple[str, dict[str, Any]]:
        options = {k: v for k, v in self.sampling.items() if k in OPENAI_KEYS}
        extra = {k: v for k, v in self.sampling.items() if k not in OPENAI_KEYS}
        response = await llm.chat.completions.create(
            model=session.model, messages=messages,  # type: ignore[arg-type]  # plain dicts
            extra_body={**extra, **session.extra_body}, **options)
        message = response.choices[0].message
        return message.content or "", assistant_message(message)

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
            client = _client_class()(base_url=self.url, message_timeout_s=self.args.timeout_s)
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


def assistant_message(message: Any) -> dict[str, Any]:
    """The assistant message as returned, to send back unchanged in the next turn."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    reasoning = getattr(message, "reasoning_content", None)
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    if message.tool_calls:
        out["tool_calls"] = [c.model_dump(exclude_none=True) for c in message.tool_calls]
    return out


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
    with a ValueError when unreachable, unfit or too small for a group (module docstring)."""
    settings = parse_args(args)
    _client_class()  # AdapterUnavailable without openenv-core
    url = server_url(target)
    schema = fetch_schema(url)
    codec = resolve_action(schema["action"], settings.action_format, settings.action_field)
    observed = resolve_observation(schema["observation"], settings.observation_field)
    env = OpenEnvEnvironment(url, settings, codec, observed)
    n = min(settings.group_size, settings.max_sessions or settings.group_size)
    check_sessions(env, run_blocking(lambda: env.probe(n)))
    return env
