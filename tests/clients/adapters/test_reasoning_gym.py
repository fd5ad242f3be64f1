"""The reasoning-gym adapter on five fast generators that need nothing but the library: the
spec and its arguments, seeded draws without repetition, epochs, weights, scoring as
reasoning-gym scores (in this process, in a worker process, with ``score_workers`` in the
scoring pool), the held-out eval split, refusals that say what exists, and three groups
against a real server (tiny model, real Redis) whose metadata names each group's generator
and task."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import msgpack
import pytest

from gspo_rl.client.adapters import AdapterUnavailable, load_adapter
from gspo_rl.client.adapters.reasoning_gym import (
    GymTask,
    ReasoningGymEnvironment,
    load,
    score_entry,
)
from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.runner import arun_groups
from tests.helpers.serving import API_KEY, RedisKeys, Served

GENERATORS = ["basic_arithmetic", "leg_counting", "chain_sum", "letter_counting",
              "spell_backward"]
FIVE = ",".join(GENERATORS)


def draw(env: ReasoningGymEnvironment, n: int) -> list[GymTask]:
    return [env.sample_task(None) for _ in range(n)]  # type: ignore[arg-type]  # rng unused


def test_a_spec_loads_and_draws_by_seed() -> None:
    env = load_adapter(f"reasoning-gym:{FIVE}", {"seed": 3, "size": 50})
    assert isinstance(env, ReasoningGymEnvironment)
    tasks = draw(env, 40)
    assert [t.id for t in tasks] == [t.id for t in draw(load(FIVE, {"seed": 3, "size": 50}), 40)]
    assert [t.id for t in tasks] != [t.id for t in draw(load(FIVE, {"seed": 4, "size": 50}), 40)]
    assert set(GENERATORS) == {t.source for t in tasks}
    for t in tasks:
        name, seed, index = t.id.split("/")
        assert name == t.source and seed == "3" and 0 <= int(index) < 50
        assert t.question == t.entry["question"] and t.answer == t.entry["answer"]
    system, user = env.prompt(tasks[0])
    assert system["role"] == "system" and "<answer>" in system["content"]
    assert user == {"role": "user", "content": tasks[0].question}
    assert env.group_metadata(tasks[0]) == {"source": tasks[0].source, "task_id": tasks[0].id}
    assert env.group_size == 8 and env.sampling["temperature"] == 1.0


@pytest.mark.parametrize("name", GENERATORS)
def test_the_reference_answer_scores_one_and_a_wrong_one_less(name: str) -> None:
    env = load(name, {"eval_size": 0})
    task = draw(env, 1)[0]
    right = f"<think>easy</think>\n<answer>{task.answer}</answer>"
    assert env.score(task, right) == 1.0
    assert env.judge(task, right).correct
    wrong = env.judge(task, "<answer>not the answer at all</answer>")
    assert wrong.reward < 1.0 and not wrong.correct
    assert env.score(task, str(task.answer)) == 0.0  # no <answer> tag: no answer
    assert env.summary()[name] == {"samples": 2, "reward_mean": 0.5, "accuracy": 0.5}


def test_partial_credit_is_kept() -> None:
    env = load("basic_arithmetic", {"eval_size": 0})
    task = draw(env, 1)[0]
    reward = env.score(task, f"<answer>x{task.answer}</answer>")
    assert reward == len(task.answer) / (len(task.answer) + 1)  # reasoning-gym's own credit


def test_generator_settings_reach_the_generator() -> None:
    env = load("leg_counting", {"leg_counting": {"min_animals": 5, "max_animals": 5},
                                "eval_size": 0})
    for task in draw(env, 5):
        assert task.entry["metadata"]["num_animals"] == 5
        assert score_entry("leg_counting", {"min_animals": 5, "max_animals": 5},
                           f"<answer>{task.answer}</answer>", task.entry) == 1.0


def test_score_entry_runs_in_a_worker_process() -> None:
    env = load("chain_sum", {"eval_size": 0})
    tasks = draw(env, 3)
    jobs = [("chain_sum", {}, f"<answer>{t.answer}</answer>", t.entry) for t in tasks]
    jobs.append(("chain_sum", {}, "<answer>x</answer>", tasks[0].entry))
    spawn = multiprocessing.get_context("spawn")  # a fresh process: nothing inherited
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        assert list(pool.map(score_entry, *zip(*jobs, strict=True))) == [1.0, 1.0, 1.0, 0.0]


def test_the_scorer_for_worker_processes_carries_no_environment() -> None:
    env = load("leg_counting,chain_sum", {"eval_size": 0})
    fn = pickle.loads(pickle.dumps(env.scorer()))
    assert len(pickle.dumps(env.scorer())) < 1000  # the configs, not the environment
    for task in draw(env, 4):
        assert env.tally(task, fn(task, f"<answer>{task.answer}</answer>")) == 1.0
    assert sum(s["samples"] for s in env.summary().values()) == 4


def test_score_workers_score_each_group_in_worker_processes_as_in_place() -> None:
    """``--env-arg score_workers=2``: a group's completions are scored by ``score_group`` (what
    the runner calls) in two spawned worker processes, never by the environment here, and
    each reward is the one scoring in place gives; ``stats`` counts them back here."""
    from gspo_rl.client.environment import score_group

    args = {"eval_size": 0, "seed": 5}
    pooled = load("leg_counting,basic_arithmetic", {**args, "score_workers": 2,
                                                    "score_timeout_s": 30})
    in_place = load("leg_counting,basic_arithmetic", args)
    assert (pooled.score_workers, pooled.score_timeout_s) == (2, 30.0)
    assert in_place.score_workers == 0
    tasks = draw(pooled, 4)
    assert [t.id for t in tasks] == [t.id for t in draw(in_place, 4)]
    groups = [[f"<answer>{t.answer}</answer>", f"<answer>x{t.answer}</answer>",
               "<answer>-1</answer>", "no answer"] for t in tasks]
    expected = [[in_place.score(t, c) for c in texts] for t, texts in zip(tasks, groups,
                                                                          strict=True)]

    def not_here(task: GymTask, completion: str) -> float:
        raise AssertionError("scored in the run's process")

    pooled.score = not_here  # type: ignore[method-assign]

    async def main() -> tuple[list[list[float]], set[str]]:
        async with pooled.serving():
            got = [await score_group(pooled, t, texts) for t, texts in zip(tasks, groups,
                                                                          strict=True)]
            workers = {p.name for p in multiprocessing.active_children()}
        return got, workers

    got, workers = asyncio.run(main())
    assert got == expected
    assert {r for rewards in expected for r in rewards} >= {0.0, 1.0}  # not all alike
    assert "gspo-scoring-ReasoningGymEnvironment" in workers
    assert pooled.summary() == in_place.summary()  # tallied back in this process
    assert pooled._scoring_pool is None, "the workers stop when the run leaves serving()"


def test_a_malformed_answer_scores_zero_and_a_broken_task_raises() -> None:
    from reasoning_gym import create_dataset

    entry = draw(load("prime_factorization", {"eval_size": 0}), 1)[0].entry
    with pytest.raises(ValueError):  # the library's own scorer raises on this answer
        create_dataset("prime_factorization").score_answer("((", entry)
    assert score_entry("prime_factorization", {}, "<answer>((</answer>", entry) == 0.0
    broken = {"question": "?", "metadata": {}}  # no answer: the scorer cannot run
    with pytest.raises(ValueError, match="broken entry"):
        score_entry("basic_arithmetic", {}, "<answer>1</answer>", broken)


def test_weights_set_the_share_of_tasks() -> None:
    env = load("leg_counting:3,basic_arithmetic", {"eval_size": 0, "size": 2000})
    counts = Counter(t.source for t in draw(env, 2000))
    assert 0.72 < counts["leg_counting"] / 2000 < 0.78  # 3 sigma: +-0.029


def test_epochs_draw_without_repetition_then_reseed() -> None:
    env = load("letter_counting", {"size": 10, "eval_size": 0})
    ids = [t.id for t in draw(env, 30)]
    for epoch in range(3):
        these = ids[10 * epoch:10 * epoch + 10]
        assert sorted(these) == sorted(f"letter_counting/{10 * epoch}/{i}" for i in range(10))
    assert ids[:10] != sorted(ids[:10])  # shuffled


def test_the_eval_split_is_disjoint_from_training() -> None:
    env = load("leg_counting,chain_sum", {"seed": 7, "eval_size": 6})
    held = env.eval_tasks()
    assert len(held) == 12 and {t.id.split("/")[1] for t in held} == {str(7 + 1_000_003)}
    # an eval seed equal to the training seed: the first epoch holds every eval question
    env = load("leg_counting", {"seed": 0, "size": 20, "eval_size": 5, "eval_seed": 0})
    questions = {t.question for t in env.eval_tasks()}
    trained = draw(env, 45)
    assert questions and not questions & {t.question for t in trained}
    assert sum(t.id.startswith("leg_counting/0/") for t in trained) == 15  # 5 skipped
    assert load("leg_counting", {"eval_size": 0}).eval_tasks() == []


def test_an_epoch_that_is_all_eval_questions_is_refused() -> None:
    env = load("leg_counting", {"size": 5, "eval_size": 5, "eval_seed": 0})
    with pytest.raises(ValueError, match="eval question"):
        draw(env, 1)


def test_system_prompts() -> None:
    from reasoning_gym.utils import SYSTEM_PROMPTS

    task = draw(load("chain_sum", {"eval_size": 0}), 1)[0]
    direct = load("chain_sum", {"system_prompt": "direct"}).prompt(task)
    assert direct[0]["content"] == SYSTEM_PROMPTS["direct"]
    assert load("chain_sum", {"system_prompt": "Be brief."}).prompt(task)[0]["content"] == \
        "Be brief."
    assert load("chain_sum", {"system_prompt": None}).prompt(task) == [
        {"role": "user", "content": task.question}]


@pytest.mark.parametrize(("target", "args", "says"), [
    ("leg_countin", {}, ["no generator 'leg_countin'", "did you mean 'leg_counting'",
                         "basic_arithmetic"]),
    ("composite", {}, ["not supported", "comma list"]),
    ("leg_counting:0", {}, ["must be > 0"]),
    ("leg_counting:two", {}, ["must be a number"]),
    ("leg_counting,leg_counting", {}, ["named twice"]),
    ("leg_counting", {"leg_counting": {"min_animal": 3}},
     ["no setting 'min_animal'", "did you mean 'min_animals'", "max_instances"]),
    ("leg_counting", {"leg_counting": {"seed": 3}}, ["set by the adapter", "'seed' argument"]),
    ("leg_counting", {"leg_counting": {"min_animals": 0}}, ["refuses", "min_animals"]),
    ("leg_counting", {"leg_counting": 3}, ["must be a mapping"]),
    ("leg_counting", {"chain_sum": {}}, ["'chain_sum'", "does not name"]),
    ("leg_counting", {"sede": 1}, ["unknown argument 'sede'", "did you mean 'seed'",
                                   "eval_size"]),
    ("leg_counting", {"size": 0}, ["size must be an integer >= 1"]),
    ("leg_counting", {"sampling": 1}, ["sampling must be a mapping"]),
    ("leg_counting", {"score_workers": -1}, ["score_workers must be an integer >= 0"]),
    ("leg_counting", {"score_workers": 1.5}, ["score_workers must be an integer >= 0"]),
    ("leg_counting", {"score_timeout_s": 0}, ["score_timeout_s must be a number > 0"]),
    ("leg_counting", {"score_timeout_s": "soon"}, ["score_timeout_s must be a number > 0"]),
])
def test_refusals_say_what_exists(target: str, args: dict, says: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        load(target, args)
    for text in says:
        assert text in str(err.value)


def test_without_the_library_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import raises ImportError
    with pytest.raises(AdapterUnavailable, match="reasoning-gym"):
        load("leg_counting", {})


def test_groups_against_a_real_server(served: Served, rkeys: RedisKeys) -> None:
    env = load_adapter("reasoning-gym:leg_counting:2,basic_arithmetic",
                       {"group_size": 3, "sampling": {"max_tokens": 6}, "eval_size": 2})

    async def main() -> list:
        async with AsyncGSPOClient(served.url, api_key=API_KEY) as client:
            return await arun_groups(env, client, 3, concurrency=3)

    outcomes = asyncio.run(main())
    assert len(outcomes) == 3
    for o in outcomes:
        assert len(o.rewards) == 3 and all(0.0 <= r <= 1.0 for r in o.rewards)
        group = rkeys.client.hgetall(rkeys.keys.group(o.group_id))
        assert msgpack.unpackb(group[b"metadata"]) == {  # difficulty: selection's band
            "source": o.task.source, "task_id": o.task.id, "difficulty": "new"}
        assert group[b"state"] in (b"published", b"dropped")  # every reward posted
    assert sum(s["samples"] for s in env.summary().values()) == 9
