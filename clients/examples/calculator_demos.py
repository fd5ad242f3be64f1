"""Demonstrations of the calculator task, for a supervised warm start (``gspo sft``):

    python -m gspo_rl.client.examples.calculator_demos --n 256 --out runs/calc_demos.jsonl

Each line is one conversation the calculator environment would hold
(``gspo_rl.client.examples.calculator``), done right: its system prompt and question, an
assistant turn that calls the ``calculator`` tool on the whole expression, the tool's result,
and the answer as a number. ``tools`` is the environment's tool list, so the chat template
renders the same prompt the episodes will see. Tasks come from the environment's own sampler
(seeded), so the demonstrations look like its tasks without being a fixed list of them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from gspo_rl.client.examples.calculator import (
    CALCULATOR_TOOL,
    SYSTEM,
    CalculatorEnvironment,
    safe_eval,
)


def demonstration(expression: str, call_id: str = "call_0") -> dict[str, Any]:
    """One solved conversation of the calculator task for ``expression``."""
    value = safe_eval(expression)
    call = {"id": call_id, "type": "function", "function": {
        "name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return {"messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What is {expression}?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": str(value)},
        {"role": "assistant", "content": f"The answer is {value}."},
    ], "tools": [CALCULATOR_TOOL]}


def demonstrations(n: int, seed: int = 1) -> list[dict[str, Any]]:
    """``n`` demonstrations of tasks drawn by the environment's sampler."""
    rng, env = random.Random(seed), CalculatorEnvironment()
    return [demonstration(env.sample_task(rng).expression) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256, help="Demonstrations to write.")
    ap.add_argument("--seed", type=int, default=1, help="Seed of the task sampler (gspo env "
                    "calculator samples with seed 0 by default).")
    ap.add_argument("--out", type=Path, required=True, help="The JSONL file to write.")
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for demo in demonstrations(args.n, args.seed):
            f.write(json.dumps(demo) + "\n")
    print(f"wrote {args.n} demonstrations to {args.out}")


if __name__ == "__main__":
    main()
