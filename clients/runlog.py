"""What ``gspo env`` shows and keeps of a run: a short live summary on the terminal and, with
a path, every finished group's transcripts and rewards as JSON lines.

``LiveSummary`` prints one line as the first group finishes and then at most every
``every_s`` seconds: groups done, their mean reward (all, and the last ``ENV_WINDOW``), the
newest policy version that sampled, groups per second and failures. ``TranscriptLog`` writes
one line per finished group: its id, task, rewards (and turn rewards), the fate the server
gave it when asked, and each sample's transcript. A single-turn group's transcript is the
prompt and the completions the environment scored; a multi-turn group's is read back from the
server (``GET /v1/groups/{id}?include=tokens``: each model turn's decoded context and text,
the tokens that are trained), one request per group, only when a path is given.
``run_and_print`` is ``run_groups`` with both (``gspo env``'s entry point).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.environment import Environment, GroupOutcome
from gspo_rl.client.failures import FailurePolicy, RunStats, log
from gspo_rl.client.runner import Alongside, run_groups
from gspo_rl.client.signal import SignalWatch

ENV_WINDOW = 32


def jsonable(x: Any, depth: int = 2) -> Any:
    """``x`` when JSON can write it as it is; else its fields where it has them (a pydantic
    model's dump, a dataclass's fields, or the ``data`` of an object with the default
    ``<... object at 0x...>`` repr, as a verifiers ``Task``); else its ``repr``."""
    try:
        json.dumps(x)
        return x
    except (TypeError, ValueError):
        pass
    if depth > 0:
        with contextlib.suppress(Exception):  # a model that cannot dump itself: its repr
            if hasattr(x, "model_dump"):
                return jsonable(x.model_dump(mode="json", exclude_none=True), depth - 1)
            if dataclasses.is_dataclass(x) and not isinstance(x, type):
                return jsonable(dataclasses.asdict(x), depth - 1)
            if getattr(type(x), "__repr__", None) is object.__repr__ and hasattr(x, "data"):
                return jsonable(x.data, depth - 1)
    return repr(x)


class LiveSummary:
    """One line now and then (``on_group`` per finished group; ``line`` to print one)."""

    def __init__(self, stats: RunStats, every_s: float = 10.0,
                 say: Callable[[str], None] = lambda s: print(s, flush=True)) -> None:
        self.stats, self.every_s, self.say = stats, every_s, say
        self.started = time.monotonic()
        self.last_said = -float("inf")
        self.groups, self.total = 0, 0.0
        self.recent: deque[float] = deque(maxlen=ENV_WINDOW)
        self.version = -1
        self.signal = SignalWatch()  # says when most recent groups carry no signal, and why

    def on_group(self, g: GroupOutcome) -> None:
        self.signal.on_group(g.rewards)
        mean = sum(g.rewards) / max(1, len(g.rewards))
        self.groups += 1
        self.total += mean
        self.recent.append(mean)
        self.version = max([self.version, *g.versions])
        if time.monotonic() - self.last_said >= self.every_s:
            self.say(self.line())

    def line(self) -> str:
        self.last_said = now = time.monotonic()
        took = now - self.started
        recent = sum(self.recent) / max(1, len(self.recent))
        version = f"  policy v{self.version}" if self.version >= 0 else ""
        failed = (f"  {self.stats.failed_attempts} failed attempts"
                  if self.stats.failed_attempts else "")
        return (f"[{int(took // 60)}:{int(took % 60):02d}] {self.groups} groups  reward "
                f"{self.total / max(1, self.groups):.3f} (last {len(self.recent)}: "
                f"{recent:.3f}){version}  {self.groups / max(took, 1e-9):.2f} groups/s"
                + failed)


class TranscriptLog:
    """Finished groups as JSON lines in ``path`` (appended). ``add`` from ``on_group``;
    ``run`` is the ``Alongside`` that writes them (reading multi-turn transcripts back)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.queue: asyncio.Queue[GroupOutcome] = asyncio.Queue()
        self.written = 0

    def add(self, g: GroupOutcome) -> None:
        self.queue.put_nowait(g)

    async def run(self, client: AsyncGSPOClient, done: asyncio.Event) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            while not (done.is_set() and self.queue.empty()):
                try:
                    g = await asyncio.wait_for(self.queue.get(), timeout=0.5)
                except TimeoutError:
                    continue
                await self._write(out, client, g)

    async def _write(self, out: IO[str], client: AsyncGSPOClient, g: GroupOutcome) -> None:
        record: dict[str, Any] = {
            "time": round(time.time(), 3), "group_id": g.group_id, "task": jsonable(g.task),
            "rewards": g.rewards, "mean_reward": sum(g.rewards) / max(1, len(g.rewards))}
        if g.fate is not None:
            record["fate"] = g.fate
        if g.texts:  # single-turn: what the environment scored
            record["prompt"] = jsonable(g.prompt)
            record["samples"] = [{"reward": r, "policy_version": v, "text": t} for r, v, t in
                                 zip(g.rewards, g.versions or [-1] * len(g.texts), g.texts,
                                     strict=True)]
        else:
            record["samples"] = await self._episodes(client, g)
        out.write(json.dumps(record) + "\n")
        out.flush()
        self.written += 1

    async def _episodes(self, client: AsyncGSPOClient, g: GroupOutcome) -> list[dict[str, Any]]:
        turns: dict[str, Any]
        try:
            view = await client.group(g.group_id, include="tokens")
            turns = {r["rollout_id"]: (r.get("trajectory") or {}).get("turns")
                     for r in view["rollouts"]}
        except Exception as exc:  # noqa: BLE001 - the rewards are still worth a line
            log.warning("no transcript for group %s: %s", g.group_id, exc)
            turns = {}
        turn_rewards = g.turn_rewards or [None] * len(g.rewards)
        return [{"rollout_id": rid, "reward": r, "turn_rewards": tr,
                 "turns": [{"context": t["context_text"], "text": t["text"]}
                           for t in turns[rid]] if turns.get(rid) else None}
                for rid, r, tr in zip(g.rollout_ids, g.rewards, turn_rewards, strict=True)]


def alongside_all(*sides: Alongside | None) -> Alongside | None:
    """One ``Alongside`` that runs every given one."""
    present = [s for s in sides if s is not None]
    if len(present) <= 1:
        return present[0] if present else None

    async def run(client: AsyncGSPOClient, done: asyncio.Event) -> None:
        await asyncio.gather(*(s(client, done) for s in present))

    return run


def run_and_print(env: Environment, base_url: str, num_groups: int | None, *,
                  api_key: str | None = None, concurrency: int = 4, seed: int = 0,
                  failures: FailurePolicy = FailurePolicy(),
                  alongside: Alongside | None = None, out: Path | None = None,
                  summary_every_s: float = 10.0, target_reward: float | None = None) -> float:
    """``run_groups`` for a terminal: a live summary (``LiveSummary``), every group's
    transcripts and rewards in ``out`` (``TranscriptLog``; None: none), then the mean over
    all groups, the failure counts and, for an environment with a ``summary()`` (tasks from
    data), its rewards per source; returns the mean. With ``target_reward``: no new group
    once the last ``ENV_WINDOW`` groups average it (the task is learned: sampling it further
    only yields equal-reward groups, which train nothing)."""
    stats = RunStats()
    live = LiveSummary(stats, summary_every_s)
    transcripts = TranscriptLog(out) if out is not None else None
    stop = asyncio.Event()

    def on_group(g: GroupOutcome) -> None:
        live.on_group(g)
        if transcripts is not None:
            transcripts.add(g)
        if target_reward and not stop.is_set() and len(live.recent) == ENV_WINDOW \
                and sum(live.recent) / ENV_WINDOW >= target_reward:
            print(f"target reward {target_reward:g} reached: the last {ENV_WINDOW} groups "
                  f"average {sum(live.recent) / ENV_WINDOW:.3f}; starting no new group",
                  flush=True)
            stop.set()

    try:
        outcomes = run_groups(env, base_url, num_groups, api_key=api_key,
                              concurrency=concurrency, seed=seed, on_group=on_group,
                              failures=failures, stats=stats, stop=stop,
                              alongside=alongside_all(
                                  alongside, transcripts.run if transcripts else None))
    finally:
        if live.groups:
            print(live.line(), flush=True)
        print(stats.summary(), flush=True)
        for source, s in getattr(env, "summary", dict)().items():
            print(f"source {source}: {s['samples']:.0f} samples, reward "
                  f"{s['reward_mean']:.3f}, correct {s['accuracy']:.3f}", flush=True)
        if transcripts is not None:
            print(f"transcripts and rewards of {transcripts.written} groups: {out}", flush=True)
    mean = sum(sum(g.rewards) / len(g.rewards) for g in outcomes) / max(1, len(outcomes))
    print(f"mean reward over {len(outcomes)} groups: {mean:.3f}")
    return mean
