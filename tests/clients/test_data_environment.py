"""Tasks from data against a real server (hf engine on the tiny model, real Redis, the openai
client for episodes): two sources mixed by weight, played until their epochs run out, their
groups carrying the source to the learner's reader (and its per-source step metrics); the
retry-with-feedback episodes; an evaluation answered unrecorded (Redis untouched) and posted
for the learner, which logs it once (its cursor survives a restart)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import redis

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.evals import EvalWatcher, evaluate
from gspo_rl.client.runner import arun_groups
from gspo_rl.client.tasks import TaskConfig, build_environment, eval_environment
from gspo_rl.contract.schema import Keys
from gspo_rl.learner.tracking.metrics import MetricsLogger, log_new_evals, source_stats
from gspo_rl.redisq.ready.reader import GroupReader
from tests.helpers.serving import API_KEY, RedisKeys, Served

CHECK = "def check(completion, answer, task):\n    return float(len(completion) % 2)\n"


def rows(prefix: str, n: int) -> str:
    return "".join(json.dumps({"id": f"{prefix}{i}", "question": f"What is {i} + {i}?",
                               "answer": str(2 * i)}) + "\n" for i in range(n))


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    (tmp_path / "a.jsonl").write_text(rows("a", 3))
    (tmp_path / "b.jsonl").write_text(rows("b", 2))
    (tmp_path / "check.py").write_text(CHECK)
    f = tmp_path / "tasks.toml"
    f.write_text('group_size = 4\nepochs = 1\nsystem_prompt = "Answer with a number."\n'
                 '[sampling]\nmax_tokens = 5\n'
                 '[verifier]\nkind = "python"\nfunction = "check.py:check"\n'
                 '[[sources]]\npath = "a.jsonl"\nweight = 2\n'
                 '[[sources]]\npath = "b.jsonl"\n'
                 '[eval]\nname = "add"\nsamples = 3\nk = [1, 3]\nevery = 1\n'
                 'sources = [{path = "a.jsonl"}]\n[eval.sampling]\ntemperature = 0\n'
                 'max_tokens = 4\n')
    return f


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def test_sources_are_played_until_used_up_and_reach_the_learner(
        served: Served, task_file: Path, redis_mod, rkeys: RedisKeys) -> None:  # noqa: ANN001
    env = build_environment(TaskConfig.load(task_file))

    async def main() -> list:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await arun_groups(env, client, None, concurrency=2)

    outcomes = run(main())
    assert sorted(o.task.id for o in outcomes) == ["a0", "a1", "a2", "b0", "b1"]  # one epoch
    assert env.summary()["a"]["samples"] == 12 and env.summary()["b"]["samples"] == 8
    client = redis.Redis.from_url(redis_mod.url)
    batch = GroupReader(client, Keys(), max_staleness=None).read_batch(10, 0, timeout_s=2)
    assert batch.groups, "every group had equal rewards (1 chance in 8**5)"
    by_id = {o.group_id: o.task for o in outcomes}
    for g in batch.groups:
        assert g.metadata == {"source": by_id[g.group_id].source,  # each task once: new
                              "task_id": by_id[g.group_id].id, "difficulty": "new"}
    stats = source_stats(batch.groups)
    assert sum(v for k, v in stats.items() if k.endswith("/groups")) == len(batch.groups)
    client.close()


def test_retry_with_feedback_episodes(served: Served, tmp_path: Path,
                                      rkeys: RedisKeys) -> None:
    (tmp_path / "t.jsonl").write_text(rows("t", 1))
    cfg = TaskConfig.model_validate({
        "sources": [{"path": str(tmp_path / "t.jsonl")}], "group_size": 2, "epochs": 1,
        "verifier": {"kind": "numeric"}, "sampling": {"max_tokens": 4},
        "multi_turn": {"max_attempts": 3, "feedback": "Wrong, again."}})
    env = build_environment(cfg)

    async def main() -> list:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await arun_groups(env, client, None)

    [outcome] = run(main())
    assert len(outcome.rollout_ids) == 2 and len(outcome.rewards) == 2
    assert env.summary()["t"]["samples"] == 2
    before = rkeys.snapshot()

    async def unrecorded() -> object:  # the same episodes, evaluated: nothing recorded
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await evaluate(env, client, env.mixture.sources[0].tasks, samples=2,
                                  ks=[1, 2])

    report = run(unrecorded())
    assert report.metrics["samples"] == 2 and rkeys.snapshot() == before
    assert env.summary()["t"]["samples"] == 2  # an evaluation counts nowhere


def test_an_evaluation_is_unrecorded_and_logged_by_the_learner_once(
        served: Served, task_file: Path, rkeys: RedisKeys, redis_mod,  # noqa: ANN001
        tmp_path: Path) -> None:
    cfg = TaskConfig.load(task_file)
    env, tasks = eval_environment(cfg)
    before = rkeys.snapshot()

    async def once() -> object:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await evaluate(env, client, tasks, name="add", samples=3, ks=[1, 3],
                                  sampling={"temperature": 0, "max_tokens": 4})

    report = run(once())
    assert rkeys.snapshot() == before  # greedy, unrecorded: nothing in Redis
    assert report.metrics["tasks"] == 3 and report.metrics["samples"] == 9
    assert all(len(set(r.texts)) == 1 for r in report.results)  # greedy: three equal answers

    ev = cfg.eval
    assert ev is not None
    watcher = EvalWatcher(env, tasks, name=ev.name, every=1, samples=ev.samples, ks=ev.k,
                          sampling=ev.sampling.body(), poll_s=0.1, out=tmp_path / "e.jsonl")

    async def watch() -> None:
        stop = asyncio.Event()
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            watcher.on_report = lambda r: stop.set()
            await watcher.run(client, stop)

    run(watch())
    assert len(watcher.reports) == 1 and (tmp_path / "e.jsonl").read_text().count("\n") == 1
    client = redis.Redis.from_url(redis_mod.url)
    path = tmp_path / "metrics.jsonl"
    logger = MetricsLogger(path, console=False)
    assert log_new_evals(client, Keys(), logger, "run1", step=7) >= 1
    assert log_new_evals(client, Keys(), logger, "run1", step=8) == 0  # logged once
    logger.close()
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    last = recs[-1]
    assert last["event"] == "eval" and last["name"] == "add" and last["step"] == 7
    assert last["eval/add/pass@3"] == watcher.reports[0].metrics["pass@3"]
    client.close()
