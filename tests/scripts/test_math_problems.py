"""The shipped math word problems (clients/examples/math) are exactly what
scripts/make_math_problems.py writes; every answer follows from its question (recomputed here
from the numbers in it), no held-out problem is a training one, and the example task file
loads with its eval set."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gspo_rl.client.tasks import TaskConfig, build_environment, eval_environment
from gspo_rl.client.verifiers import make_verifier
from scripts.make_math_problems import files

MATH = Path(__file__).resolve().parents[2] / "clients" / "examples" / "math"
RULES = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
         "div": lambda a, b: a // b, "add_sub": lambda a, b, c: a + b - c,
         "mul_add": lambda a, b, c: a * b + c, "compare": lambda a, b: a - b,
         "double": lambda a: 2 * a}


def test_the_files_are_the_scripts_output() -> None:
    for name, text in files().items():
        assert (MATH / name).read_text() == text, f"{name}: run scripts/make_math_problems.py"


def test_every_answer_follows_from_its_question() -> None:
    rows = {name: [json.loads(line) for line in text.splitlines()]
            for name, text in files().items()}
    numeric = make_verifier("numeric")
    for row in (r for part in rows.values() for r in part):
        numbers = [int(x) for x in re.findall(r"\d+", row["question"])]
        if row["skill"] == "div":
            numbers = [numbers[0], numbers[1]]  # total, friends
        assert RULES[row["skill"]](*numbers) == int(row["answer"]), row
        assert int(row["answer"]) >= 0
        assert numeric(f"... Answer: {row['answer']}", row["answer"]).correct
    train = {r["question"] for r in rows["one_step.jsonl"] + rows["two_step.jsonl"]}
    assert not train & {r["question"] for r in rows["test.jsonl"]}
    ids = [r["id"] for part in rows.values() for r in part]
    assert len(ids) == len(set(ids)) == 268


def test_the_example_task_file_loads() -> None:
    cfg = TaskConfig.load(MATH / "tasks.toml")
    env = build_environment(cfg)
    assert {s.name: s.weight for s in env.mixture.sources} == {"one_step": 2.0,
                                                               "two_step": 1.0}
    _, tasks = eval_environment(cfg)
    assert len(tasks) == 48
