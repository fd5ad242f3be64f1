"""Write the small math-word-problem set shipped with the SDK (clients/examples/math/).

    .venv/bin/python scripts/make_math_problems.py   # rewrites one_step, two_step and test

Every problem is made here from a template and seeded random numbers (no download, same bytes
every run: tests/scripts/test_math_problems.py holds the files to this script's output). One
or two steps of + - * / on small whole numbers, the answer a whole number >= 0: 160 one-step
problems (``one_step.jsonl``), 60 two-step ones (``two_step.jsonl``) and 48 held-out ones of
both kinds (``test.jsonl``). Each record: ``id``, ``question``, ``answer`` (the number, as
text) and ``skill`` (the template's name).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "clients" / "examples" / "math"
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivo", "Jun", "Kofi",
         "Lena", "Mo", "Nia", "Omar", "Pia", "Ravi", "Sara", "Tom", "Uma"]
THINGS = ["apples", "marbles", "stickers", "books", "shells", "coins", "pencils", "cookies",
          "stamps", "cards"]

Problem = tuple[str, int]


def add(r: random.Random, who: str, what: str) -> Problem:
    a, b = r.randint(2, 30), r.randint(2, 30)
    return f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?", a + b


def sub(r: random.Random, who: str, what: str) -> Problem:
    a = r.randint(10, 40)
    b = r.randint(1, a - 1)
    return f"{who} has {a} {what} and gives away {b}. How many {what} are left?", a - b


def mul(r: random.Random, who: str, what: str) -> Problem:
    a, b = r.randint(2, 9), r.randint(2, 9)
    return (f"{who} has {a} boxes with {b} {what} in each box. How many {what} is that in "
            "all?", a * b)


def div(r: random.Random, who: str, what: str) -> Problem:
    b, q = r.randint(2, 9), r.randint(2, 9)
    return (f"{who} shares {b * q} {what} equally among {b} friends. How many {what} does "
            "each friend get?", q)


def add_sub(r: random.Random, who: str, what: str) -> Problem:
    a, b = r.randint(5, 30), r.randint(2, 20)
    c = r.randint(1, a + b - 1)
    return (f"{who} has {a} {what}, finds {b} more, then loses {c}. How many {what} does "
            f"{who} have?", a + b - c)


def mul_add(r: random.Random, who: str, what: str) -> Problem:
    a, b, c = r.randint(2, 6), r.randint(2, 9), r.randint(1, 15)
    return (f"{who} buys {a} packs of {b} {what} and already had {c}. How many {what} does "
            f"{who} have now?", a * b + c)


def compare(r: random.Random, who: str, what: str) -> Problem:
    a = r.randint(10, 50)
    b = r.randint(1, a - 1)
    other = NAMES[(NAMES.index(who) + 7) % len(NAMES)]
    return (f"{who} has {a} {what} and {other} has {b}. How many more {what} does {who} "
            "have?", a - b)


def double(r: random.Random, who: str, what: str) -> Problem:
    a = r.randint(2, 25)
    return f"{who} had {a} {what} and then doubled them. How many {what} now?", 2 * a


SKILLS: dict[str, Callable[[random.Random, str, str], Problem]] = {
    f.__name__: f for f in (add, sub, mul, div, add_sub, mul_add, compare, double)}
TWO_STEP = ("add_sub", "mul_add")
ONE_STEP = tuple(sorted(set(SKILLS) - set(TWO_STEP)))


def problems(n: int, seed: int, prefix: str,
             skills: tuple[str, ...] = tuple(sorted(SKILLS))) -> list[dict[str, str]]:
    r = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        skill = r.choice(skills)
        question, answer = SKILLS[skill](r, r.choice(NAMES), r.choice(THINGS))
        if question in seen:
            continue
        seen.add(question)
        out.append({"id": f"{prefix}-{len(out):03d}", "question": question,
                    "answer": str(answer), "skill": skill})
    return out


def render(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def files() -> dict[str, str]:
    """The shipped files' contents (module docstring); no test problem is a training one."""
    one = problems(160, seed=2024, prefix="one", skills=ONE_STEP)
    two = problems(60, seed=2025, prefix="two", skills=TWO_STEP)
    held = {row["question"] for row in one + two}
    test = [row for row in problems(80, seed=7, prefix="test") if row["question"] not in held]
    return {"one_step.jsonl": render(one), "two_step.jsonl": render(two),
            "test.jsonl": render(test[:48])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (args.out / name).write_text(text)
        print(f"wrote {args.out / name} ({text.count(chr(10))} problems)")


if __name__ == "__main__":
    main()
