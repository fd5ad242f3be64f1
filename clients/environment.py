"""Environments: where tasks come from, how episodes run, how they are scored.

- ``SingleTurnEnvironment``: one prompt, ``group_size`` samples through ``POST /v1/rollouts``,
  one score per sample. Implement ``sample_task``, ``prompt`` and ``score``.
- ``MultiTurnEnvironment``: ``group_size`` episodes opened with ``POST /v1/groups``, each
  talking to the server through the official ``openai`` client with its ``rollout_id``
  (``session.extra_body``) and returning a reward (plus optional per-turn rewards: one per
  chat completion, in order). Implement ``sample_task`` and ``episode``; send the whole
  conversation each turn, the assistant messages exactly as returned.

``run_groups`` / ``arun_groups`` (``gspo_rl.client.runner``; also ``gspo_rl.client``) drive
either shape with bounded concurrency and post the rewards. With ``resample_equal_rewards =
k`` a task whose group the server dropped for equal rewards is played again as a new group,
up to ``k`` times (``RunStats.resampled``). A finite
task source (tasks from data) raises ``TasksExhausted`` from ``sample_task``: the run ends
once the groups in flight finish. Errors are never turned into a reward: a failing group is
given up on the server at once (``give_up``: it holds no admission capacity), then its task
retried or abandoned
(``gspo_rl.client.failures.FailurePolicy``), counted in ``RunStats``, and the run goes on.
Tutorial: docs/environments.md.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.errors import ServerUnavailable
from gspo_rl.client.failures import log
from gspo_rl.client.mixture import ENV_KEY
from gspo_rl.client.scoring import ScoringPool
from gspo_rl.client.selection import BAND_KEY


class TasksExhausted(Exception):
    """Raised by ``sample_task`` when a finite source of tasks is used up."""


@dataclass
class EpisodeResult:
    """The outcome of one episode: a final reward and, optionally, one reward per model turn;
    ``correct`` (None: unknown) is what an evaluation's pass@k counts."""

    reward: float
    turn_rewards: list[float] | None = None
    correct: bool | None = None


@dataclass
class EpisodeSession:
    """What an episode needs to talk to the server as itself: ``openai_base_url``,
    ``api_key`` and ``model`` for ``openai.AsyncOpenAI`` / ``chat.completions.create``, and
    ``extra_body`` for every chat completion of the episode."""

    base_url: str
    rollout_id: str | None
    group_id: str | None
    model: str = "default"
    api_key: str | None = None
    record: bool = True
    """False: an evaluation's episode, served unrecorded (no rollout, no group)."""

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url.rstrip('/')}/v1"

    @property
    def extra_body(self) -> dict[str, Any]:
        """Pass as ``extra_body=`` to ``client.chat.completions.create``."""
        if not self.record:
            return {"record": False}
        return {"rollout_id": self.rollout_id}


@dataclass
class GroupOutcome:
    """One finished group: its id, the rewards posted, and the environment's task (multi-turn:
    also the episodes' rollout ids and turn rewards)."""

    group_id: str
    rewards: list[float]
    task: Any = None
    texts: list[str] = field(default_factory=list)
    prompt: Any = None  # single-turn: the prompt string or chat messages sampled
    rollout_ids: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The policy version of each sample (multi-turn: the server's when it opened the group,
    empty from a server that does not say it)."""
    turn_rewards: list[list[float] | None] = field(default_factory=list)
    fate: str | None = None
    """The group's end as the server reported it when asked (``resample_equal_rewards``):
    "published", "dropped:<reason>" (e.g. "dropped:zero_variance"); None: not asked."""
    env: str = ""
    """The environment's name in a mix (``gspo_rl.client.mixture``); "" for a single one."""


class SingleTurnEnvironment(abc.ABC):
    """One prompt, ``group_size`` samples, a score per sample."""

    group_size: int = 8
    sampling: dict[str, Any] = {"temperature": 1.0, "max_tokens": 32}
    resample_equal_rewards: int = 0
    """Play a task again, as a new group, when the server dropped its group for equal
    rewards; at most this many times per task (0: never)."""
    score_workers: int = 0
    """0: ``score`` runs on the event loop. N: in N worker processes, a group's completions
    at once, off the loop (``gspo_rl.client.scoring``; ``score`` must then be pure: it runs on
    a copy of the environment). Guide: docs/environments/scoring.md."""
    score_timeout_s: float = 60.0
    """With ``score_workers``: a call past this is killed and its group fails."""
    _scoring_pool: ScoringPool | None = None

    def scorer(self) -> Callable[[Any, str], Any]:
        """What a scoring worker runs as ``fn(task, completion)``, pickled into each worker
        once. Default: ``score`` (the whole environment is pickled with it)."""
        return self.score

    def tally(self, task: Any, scored: Any) -> float:
        """Back in this process: the reward of what ``scorer()`` returned; count here what
        the environment keeps (a worker's changes to its copy are lost). Default: float."""
        return float(scored)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Held around a run (``gspo_rl.client.mixture``, re-entrant): the scoring workers
        stop when the outermost holder leaves."""
        self._serving_depth = getattr(self, "_serving_depth", 0) + 1
        try:
            yield
        finally:
            self._serving_depth -= 1
            if self._serving_depth == 0:
                close_scoring(self)

    @abc.abstractmethod
    def sample_task(self, rng: random.Random) -> Any:
        """A task (anything: the prompt's ingredients and the answer key)."""

    @abc.abstractmethod
    def prompt(self, task: Any) -> str | list[dict[str, Any]]:
        """A raw prompt string, or chat messages (rendered with the model's chat template)."""

    @abc.abstractmethod
    def score(self, task: Any, completion: str) -> float:
        """The reward of one completion. Raise on a broken task; never return 0.0 for one."""

    def group_metadata(self, task: Any) -> dict[str, Any]:
        """Stored with the group and handed to the learner (e.g. a task id). Default: none."""
        return {}


class MultiTurnEnvironment(abc.ABC):
    """``group_size`` episodes of one task, each driven through the openai client."""

    group_size: int = 4
    resample_equal_rewards: int = 0
    """As ``SingleTurnEnvironment.resample_equal_rewards``."""

    @abc.abstractmethod
    def sample_task(self, rng: random.Random) -> Any:
        """A task shared by the episodes of one group."""

    @abc.abstractmethod
    async def episode(self, task: Any, session: EpisodeSession) -> EpisodeResult | float:
        """Run one episode (any number of chat completions with ``session.extra_body``).
        ``EpisodeResult.turn_rewards``, if given, has one entry per chat completion made."""

    def group_metadata(self, task: Any) -> dict[str, Any]:
        """Stored with the group and handed to the learner (e.g. a task id). Default: none."""
        return {}


Environment = SingleTurnEnvironment | MultiTurnEnvironment
EQUAL_REWARDS = "dropped:zero_variance"


def group_metadata(env: Environment, task: Any, tag: str = "",
                   band: str = "") -> dict[str, Any] | None:
    """The environment's metadata of the task's group, with ``{"env": tag}`` in a mix and
    the ``difficulty`` band the task was drawn in (``gspo_rl.client.selection``)."""
    meta = dict(env.group_metadata(task) or {})
    if tag:
        meta[ENV_KEY] = tag
    if band:
        meta[BAND_KEY] = band
    return meta or None


async def served_model(client: AsyncGSPOClient) -> str:
    """The model name the server expects in ``model`` (from ``/health``)."""
    return str((await client.health())["model"])


async def group_fate(client: AsyncGSPOClient, posted: Any, group_id: str) -> str | None:
    """How the group ended, once the posted rewards completed it ("published",
    "dropped:<reason>", "expired"); None while it is still open."""
    results = posted.get("results", []) if isinstance(posted, dict) else []
    if not any(r.get("group_complete") for r in results):
        return None
    g = await client.group(group_id)
    state = str(g.get("state"))
    return f"dropped:{g.get('drop_reason')}" if state == "dropped" else state


async def arun_group(env: Environment, client: AsyncGSPOClient, task: Any,
                     model: str | None = None, tag: str = "", band: str = "") -> GroupOutcome:
    """Sample (or play) one group, score it, post its rewards. ``model``: the served model's
    name for chat completions (None: ask the server); ``tag``: the environment's name in a mix
    (``gspo_rl.client.mixture``), and ``band`` the task's difficulty band
    (``gspo_rl.client.selection``), added to the group's metadata. With
    ``env.resample_equal_rewards`` the server is asked how the group ended
    (``GroupOutcome.fate``)."""
    outcome, posted = await _sample_and_score(env, client, task, model, tag, band)
    outcome.env = tag
    if env.resample_equal_rewards > 0:
        outcome.fate = await group_fate(client, posted, outcome.group_id)
    return outcome


async def _sample_and_score(env: Environment, client: AsyncGSPOClient, task: Any,
                            model: str | None, tag: str = "",
                            band: str = "") -> tuple[GroupOutcome, Any]:
    if isinstance(env, SingleTurnEnvironment):
        p = env.prompt(task)
        kwargs: dict[str, Any] = {"prompt": p} if isinstance(p, str) else {"messages": p}
        group = await client.rollouts(n=env.group_size,
                                      metadata=group_metadata(env, task, tag, band),
                                      **kwargs, **env.sampling)
        try:
            texts = [r.text for r in group.rollouts]
            rewards = await score_group(env, task, texts)
            posted = await client.post_rewards([{"rollout_id": r.rollout_id, "reward": x}
                                                for r, x in zip(group.rollouts, rewards,
                                                                strict=True)])
        except Exception as exc:
            await give_up(client, cast(str, group.group_id), exc)  # recorded: it has an id
            raise
        return GroupOutcome(group_id=cast(str, group.group_id), rewards=rewards, task=task,
                            texts=texts, prompt=p,
                            versions=[r.policy_version for r in group.rollouts]), posted
    model = model or await served_model(client)
    opened = await client.open_group(env.group_size, group_metadata(env, task, tag, band))
    try:
        return await _play_episodes(env, client, task, model, opened)
    except Exception as exc:
        await give_up(client, opened["group_id"], exc)
        raise


async def score_group(env: SingleTurnEnvironment, task: Any, texts: list[str]) -> list[float]:
    """The rewards of one group's completions: ``env.score`` here (``score_workers`` 0), else
    ``env.scorer()`` in the environment's worker processes, all at once, each result
    ``env.tally``-ed here. A worker's timeout, crash or error raises (``ScoringError``)."""
    if env.score_workers <= 0:
        return [float(env.score(task, t)) for t in texts]
    results = await scoring_pool(env).score_many([(task, t) for t in texts])
    return [float(env.tally(task, r)) for r in results]


def scoring_pool(env: SingleTurnEnvironment) -> ScoringPool:
    """The environment's scoring workers, made on first use (``score_workers`` > 0) and kept
    on it until ``close_scoring(env)``."""
    pool = env._scoring_pool
    if pool is None or pool.closed:
        pool = env._scoring_pool = ScoringPool.for_environment(env)
    return pool


def close_scoring(env: Any) -> None:
    """Stop the environment's scoring workers, if it has any (idempotent; a later group starts
    new ones). Call it when the run ends."""
    pool = getattr(env, "_scoring_pool", None)
    if pool is not None:
        env._scoring_pool = None
        pool.close()


async def _play_episodes(env: MultiTurnEnvironment, client: AsyncGSPOClient, task: Any,
                         model: str, opened: dict[str, Any]) -> tuple[GroupOutcome, Any]:
    sessions = [EpisodeSession(base_url=client.base_url, rollout_id=rid,
                               group_id=opened["group_id"], model=model, api_key=client.api_key)
                for rid in opened["rollout_ids"]]
    results = await asyncio.gather(*(env.episode(task, s) for s in sessions))
    outcomes = [r if isinstance(r, EpisodeResult) else EpisodeResult(float(r)) for r in results]
    posted = await client.post_rewards([
        {"rollout_id": s.rollout_id, "reward": o.reward, "turn_rewards": o.turn_rewards}
        for s, o in zip(sessions, outcomes, strict=True)])
    # the version the group was opened at: its episodes sampled at it or later (their
    # completions are the episode's own client's, not seen here)
    version = opened.get("policy_version")
    return GroupOutcome(group_id=opened["group_id"], rewards=[o.reward for o in outcomes],
                        task=task, rollout_ids=[cast(str, s.rollout_id) for s in sessions],
                        turn_rewards=[o.turn_rewards for o in outcomes],
                        versions=[] if version is None else [int(version)] * len(outcomes)
                        ), posted


async def give_up(client: AsyncGSPOClient, group_id: str, why: Exception) -> None:
    """A group whose episode, scoring or reward post failed will get no more rewards: give it
    up on the server (``abandon_group``) so that it stops holding admission capacity now, not
    at its deadline. Not when the server stayed unreachable through the client's whole
    outage patience (it cannot hear it; the group's idle time releases it there)."""
    if isinstance(why, ServerUnavailable):
        log.warning("group %s left open: the server is unreachable (%s); it stops counting "
                    "as in flight once idle (group_idle_s) and expires at its deadline",
                    group_id, why)
        return
    try:
        await client.abandon_group(group_id)
    except Exception as exc:  # noqa: BLE001 - the group's own failure is what propagates
        log.warning("could not abandon group %s (%s): it stays open until it is idle "
                    "(group_idle_s) or its deadline", group_id, exc)

