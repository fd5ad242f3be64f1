"""Tasks from data without a server: records from JSONL, JSON, Parquet and a datasets
directory; fields found or named; epochs, seeded shuffling and weighted mixing; task files
(TOML, YAML) with relative paths and refused typos; pass@k."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gspo_rl.client.evals import TaskResult, pass_at_k, summarize
from gspo_rl.client.tasks import (
    Fields,
    TaskConfig,
    TaskMixture,
    TasksExhausted,
    TaskSource,
    build_environment,
    eval_environment,
    make_tasks,
    read_records,
)

ROWS = [{"id": f"q{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)}
        for i in range(6)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    return path


def test_every_format_reads_the_same_records(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = write_jsonl(tmp_path / "t.jsonl", ROWS)
    (tmp_path / "t.json").write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "t.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS[:2])}).save_to_disk(
        str(tmp_path / "dd"))
    for path in (jsonl, tmp_path / "t.json", tmp_path / "t.parquet", tmp_path / "ds"):
        assert read_records(path) == ROWS, path
    assert read_records(tmp_path / "dd", split="test") == ROWS[:2]
    with pytest.raises(ValueError, match="splits"):
        read_records(tmp_path / "dd")
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_records(tmp_path / "bad.jsonl")
    (tmp_path / "t.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown task file type"):
        read_records(tmp_path / "t.csv")


def test_fields_are_found_or_named() -> None:
    tasks = make_tasks(ROWS, "s", Fields(system_prompt="Be brief."))
    assert tasks[0].id == "q0" and tasks[0].answer == "1"
    assert tasks[0].chat() == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "What is 0 + 1?"}]
    templated = make_tasks(ROWS, "s", Fields(template="Q: {question}\nA:"))
    assert templated[1].prompt == "Q: What is 1 + 1?\nA:" and templated[1].messages is None
    chat = make_tasks([{"messages": [{"role": "user", "content": "hi"}], "target": 3}], "c",
                      Fields())
    assert chat[0].messages == [{"role": "user", "content": "hi"}] and chat[0].answer == 3
    with pytest.raises(ValueError, match="record 0: the record names no answer field"):
        make_tasks([{"question": "x"}], "s", Fields())
    with pytest.raises(ValueError, match="no field 'q'"):
        make_tasks(ROWS, "s", Fields(prompt="q"))


def test_epochs_and_seeded_shuffling() -> None:
    tasks = make_tasks(ROWS, "s", Fields())
    source = TaskSource("s", tasks, epochs=2, seed=3)
    drawn = [source.next() for _ in range(13)]
    assert drawn[-1] is None and None not in drawn[:12]
    first, second = [t.id for t in drawn[:6]], [t.id for t in drawn[6:12]]
    assert sorted(first) == sorted(second) == sorted(r["id"] for r in ROWS)
    assert first != second  # each epoch in a new order
    again = TaskSource("s", tasks, epochs=2, seed=3)
    assert [again.next().id for _ in range(12)] == first + second  # same seed, same order
    plain = TaskSource("s", tasks, epochs=1, shuffle=False)
    assert [plain.next().id for _ in range(6)] == [r["id"] for r in ROWS]


def test_a_mixture_draws_by_weight_until_every_source_is_used_up() -> None:
    a = TaskSource("a", make_tasks(ROWS, "a", Fields()), weight=3.0, seed=1)
    b = TaskSource("b", make_tasks(ROWS, "b", Fields()), weight=1.0, seed=1)
    mix = TaskMixture([a, b], seed=0)
    counts = Counter(mix.next().source for _ in range(4000))
    assert 0.70 < counts["a"] / 4000 < 0.80  # 3:1
    once = TaskMixture([TaskSource("a", make_tasks(ROWS, "a", Fields()), epochs=1),
                        TaskSource("b", make_tasks(ROWS[:2], "b", Fields()), epochs=1)])
    drawn = [once.next() for _ in range(8)]
    assert Counter(t.source for t in drawn) == {"a": 6, "b": 2}
    with pytest.raises(TasksExhausted):
        once.next()


def test_task_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS[:3])
    (tmp_path / "tasks.toml").write_text(
        'name = "add"\ngroup_size = 4\n[verifier]\nkind = "numeric"\nformat_reward = 0.1\n'
        '[[sources]]\npath = "train.jsonl"\nweight = 2\n'
        '[eval]\nevery = 3\nsamples = 2\nk = [1, 2]\nsources = [{path = "test.jsonl"}]\n')
    cfg = TaskConfig.load(tmp_path / "tasks.toml")
    assert Path(cfg.sources[0].path) == tmp_path / "train.jsonl"  # relative to the file
    env = build_environment(cfg)
    assert env.group_size == 4 and env.score(env.sample_task(random.Random()), "Answer: 99")
    ev_env, ev_tasks = eval_environment(cfg)
    assert [t.id for t in ev_tasks] == ["q0", "q1", "q2"]
    (tmp_path / "tasks.yaml").write_text(
        "sources:\n  - path: train.jsonl\nverifier:\n  kind: exact\n")
    assert TaskConfig.load(tmp_path / "tasks.yaml").verifier.kind == "exact"
    (tmp_path / "typo.toml").write_text('[[sources]]\npath = "train.jsonl"\ngroup_sise = 3\n')
    with pytest.raises(ValueError, match="group_sise"):
        TaskConfig.load(tmp_path / "typo.toml")
    with pytest.raises(ValueError, match="every k must be"):
        TaskConfig.model_validate({"sources": [{"path": "x"}],
                                   "eval": {"sources": [{"path": "y"}], "samples": 2,
                                            "k": [4]}})


@given(st.integers(1, 30).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n),
                                                      st.integers(1, n))))
def test_pass_at_k_is_the_chance_a_k_subset_holds_a_correct_answer(nck: tuple) -> None:
    n, c, k = nck
    p = pass_at_k(n, c, k)
    assert 0.0 <= p <= 1.0
    assert (p == 0.0) == (c == 0) and (p == 1.0) == (n - c < k)
    if k == 1:
        assert p == pytest.approx(c / n)


def test_summary_per_source() -> None:
    results = [TaskResult("1", "a", [1.0, 0.0], [True, False]),
               TaskResult("2", "b", [0.1, 0.1], [False, False])]
    m = summarize(results, [1, 2])
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@2"] == pytest.approx(0.5)
    assert m["mean_reward"] == pytest.approx(0.3) and m["tasks"] == 2
    assert m["a/pass@2"] == 1.0 and m["b/pass@1"] == 0.0
