"""The environment's side of ``gspo up`` while the learner trains (``drive``): the groups, the
evaluations, the progress shown, and how each of them ends.

``drive`` runs the environment's groups (and its eval set, every N versions) until the
learner finishes (its step cap or the target reward), waits for the final evaluation, or the
clock runs out; a child's crash surfaces at once. After training it runs the final evaluation
at the version the learner trained last. Every wait is bounded: the groups get 10 s to cancel,
an evaluation ``EVAL_WAIT_S`` (said past ``EVAL_SAY_S``), the learner ``LEARNER_EXIT_S`` to
exit; on Ctrl-C an evaluation under way is cancelled, not awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

from gspo_rl.launch.config import UpConfig
from gspo_rl.launch.processes import Processes
from gspo_rl.launch.runlog import ENV_WINDOW, JsonlTail
from gspo_rl.launch.watch import until_exit, watch_learner
from gspo_rl.launch.workload import Workload

log = logging.getLogger(__name__)
LEARNER_EXIT_S = 60.0
"""After the final evaluation, the learner's time to log it and exit."""
LEARNER_START_GRACE_S = 120.0
"""How long the environment waits for the learner gspo up started before it says "no learner
is connected" (its start-up on a loaded machine; a learner that exits is said at once)."""
# After the clock or the learner ends the run: an evaluation is given this long to finish,
# and a wait past EVAL_SAY_S is said while it lasts.
EVAL_WAIT_S, EVAL_SAY_S = 300.0, 30.0


def task_json(task: Any, limit: int = 1000) -> Any:
    """A group's task for ``env_rewards.jsonl``: its JSON form (``gspo_rl.client.runlog``),
    or, over ``limit`` characters, the start of that JSON as a string."""
    from gspo_rl.client.runlog import jsonable

    value = jsonable(task)
    text = json.dumps(value)
    return value if len(text) <= limit else text[:limit]


def status(steps: deque[dict[str, Any]], env_rewards: deque[float]) -> dict[str, Any]:
    """Progress figures from the latest learner steps and environment groups."""
    last = steps[-1] if steps else {}
    hist = last.get("staleness", {}) or {}
    n = sum(hist.values())
    stale = sum(int(k) * v for k, v in hist.items()) / n if n else 0.0
    recent = [r["reward_mean"] for r in steps if "reward_mean" in r]
    return {"step": int(last.get("step", 0)),
            "reward": sum(recent) / len(recent) if recent else float("nan"),
            "env_reward": sum(env_rewards) / len(env_rewards) if env_rewards else float("nan"),
            "tok_s": float(last.get("tokens_per_s", 0.0)), "staleness": stale,
            "trained_fraction": float(last.get("trained_group_fraction", 1.0)),
            "token_fraction": float(last.get("trained_token_fraction", 1.0))}


async def drive(cfg: UpConfig, work: Workload, url: str, api_key: str, metrics: Path,
                 procs: Processes, on_status: Any) -> None:
    """Run the environment until the learner finishes (its step cap, or the target
    reward: ``gspo_rl.learner.runtime.target``) or the clock runs out; surface any child's crash at
    once. With an eval set: evaluated every N versions meanwhile, and once more at the end,
    while the learner waits to log it (``gspo_rl.learner.runtime.final_eval``). The environments'
    ``serving`` contexts are held throughout (``gspo_rl.client.mixture``)."""
    from gspo_rl.client.client import AsyncGSPOClient, RetryPolicy
    from gspo_rl.client.mixture import serving_all
    from gspo_rl.client.runner import arun_groups
    from gspo_rl.client.signal import SignalWatch

    stop = asyncio.Event()
    env_rewards: deque[float] = deque(maxlen=ENV_WINDOW)
    env_log = open(cfg.run_dir / "env_rewards.jsonl", "a")  # noqa: SIM115 (closed below)

    signal = SignalWatch()  # says when most recent groups carry no signal, and why

    def on_group(g: Any) -> None:
        signal.on_group(g.rewards)
        reward = sum(g.rewards) / len(g.rewards)
        env_rewards.append(reward)
        env_log.write(json.dumps({"time": time.time(), "group_id": g.group_id,
                                  "version": min(g.versions) if g.versions else -1,
                                  "reward": reward, "task": task_json(g.task),
                                  **({"env": g.env} if g.env else {})}) + "\n")
        env_log.flush()

    steps = deque[dict[str, Any]](maxlen=5)
    # the learner's end is the run's end; its start-up is expected (one that exits is said)
    quiet = RetryPolicy(quiet_when_finished=True, no_learner_grace_s=LEARNER_START_GRACE_S)
    async with serving_all(work.env), AsyncGSPOClient(url, api_key=api_key,
                                                      retry=quiet) as client:
        runner = asyncio.create_task(arun_groups(
            work.env, client, None, concurrency=cfg.concurrency, seed=work.seed, stop=stop,
            on_group=on_group))
        evals = asyncio.create_task(work.watcher.run(client, stop)) if work.watcher else None
        waiting: int | None = None  # the version the learner waits to see evaluated
        interrupted = True  # until the watch returns
        try:
            waiting = await watch_learner(cfg.minutes, runner, procs, JsonlTail(metrics), steps,
                                          lambda: on_status(status(steps, env_rewards)))
            interrupted = False
        finally:
            stop.set()
            await end_side_tasks(runner, evals, interrupted)
            env_log.close()
        if work.watcher is not None and procs.alive("server"):  # after training, unrecorded
            on_status({**status(steps, env_rewards), "final_eval": True})
            try:  # unless the last one was of this version; it must not end the run
                await bounded(work.watcher.run_final(client, waiting),
                               "the final evaluation")
            except Exception as exc:  # noqa: BLE001 - reported, the run's results stand
                log.warning("the final evaluation failed: %s: %s", type(exc).__name__, exc)
        if waiting is not None:  # the learner logs the final evaluation, then exits
            await until_exit(procs, "learner", LEARNER_EXIT_S)
    # the subprocess transports a cancelled episode left (verifiers' harness programs) are
    # collected while the loop still runs: once it is closed they raise at exit
    gc.collect()


async def end_side_tasks(runner: asyncio.Task[Any], evals: asyncio.Task[Any] | None,
                          interrupted: bool) -> None:
    """The groups are cancelled (10 s for it: one that hangs is named at exit,
    ``gspo_rl.launch.aio``); an evaluation under way finishes within ``EVAL_WAIT_S``, unless
    the run was interrupted (then it is cancelled too)."""
    runner.cancel()
    if evals is not None and interrupted:
        evals.cancel()
    side = {runner} if evals is None else {runner, evals}
    await asyncio.wait(side, timeout=10)
    if evals is not None and not interrupted:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await bounded(evals, "the evaluation under way")
    for t in side:  # retrieved: an environment error was raised by the watch already
        if t.done() and not t.cancelled():
            t.exception()


async def bounded(work: Any, what: str) -> Any:
    """``work`` (a coroutine or task), cancelled after ``EVAL_WAIT_S`` with a warning that
    says so; a wait past ``EVAL_SAY_S`` is said while it lasts."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=EVAL_SAY_S)
    if not done:
        log.warning("waiting for %s (at most %g s more)", what, EVAL_WAIT_S - EVAL_SAY_S)
        done, _ = await asyncio.wait({task}, timeout=EVAL_WAIT_S - EVAL_SAY_S)
    if not done:
        task.cancel()
        log.warning("%s took longer than %g s: cancelled", what, EVAL_WAIT_S)
        raise TimeoutError(f"{what} took longer than {EVAL_WAIT_S:g} s")
    return task.result()
