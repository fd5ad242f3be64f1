"""A multi-turn tool-use task: arithmetic with a calculator tool, driven by the openai client.

    python -m gspo_rl.client.examples.calculator --url http://127.0.0.1:8000 --groups 10
    gspo env calculator --groups 10

Each group is one arithmetic problem ("What is 17 * 3 - 5?"); each of its episodes is one
conversation through the official ``openai.AsyncOpenAI`` client, every chat completion
carrying the episode's ``rollout_id`` (``extra_body``). The agent offers a ``calculator``
tool (``tools=[CALCULATOR_TOOL]``); when the model answers with ``tool_calls``, the
environment evaluates each expression with a small arithmetic evaluator (``safe_eval``: a
whitelist over Python's AST, never ``eval``) and appends ``{"role": "tool", ...}`` results.
A reply without tool calls is the model's answer: the last number in it. A reply with no number
gets a one-line nudge. The episode ends with an answer or after ``max_turns`` model turns.

Rewards: the final reward is 1.0 when the answer equals the result, else 0.0; each model turn
earns a turn reward of ``TOOL_BONUS`` (0.1) when it made tool calls and every one of them was a
well-formed calculator call the evaluator accepted (else 0.0): one turn reward per model turn,
as the server checks. A tiny random model rarely calls the tool or answers right; its
episodes still run end to end (mostly ``max_turns`` turns of noise and nudges).
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from gspo_rl.client.environment import (
    EpisodeResult,
    EpisodeSession,
    MultiTurnEnvironment,
)
from gspo_rl.client.runlog import run_and_print
from gspo_rl.client.selection import TaskSelection

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

try:
    from openai import AsyncOpenAI
except ImportError as exc:  # the SDK itself is httpx-only; this example needs the client
    raise ImportError("the calculator example drives episodes with the official openai "
                      "client: pip install openai") from exc

CALCULATOR_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression: numbers, + - * / // % ** and "
                   "parentheses.",
    "parameters": {"type": "object",
                   "properties": {"expression": {"type": "string",
                                                 "description": "e.g. (17 + 4) * 3"}},
                   "required": ["expression"]}}}
SYSTEM = ("You are a careful assistant. Use the calculator tool for arithmetic, then reply "
          "with the final answer as a number.")
NUDGE = "Reply with the final answer as a number, or call the calculator tool."
TOOL_BONUS = 0.1
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e18

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos, ast.USub: operator.neg}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return cast("int | float", node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise ValueError("result out of range")
        return value
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def safe_eval(expression: str) -> int | float:
    """The value of an arithmetic expression; ``ValueError`` for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    value = _eval(tree.body)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    return float(found[-1]) if found else None


@dataclass(frozen=True)
class CalculatorTask:
    expression: str
    answer: int | float


def run_tool_call(call: Any) -> tuple[dict[str, Any], bool]:
    """One tool call (an openai ``ChatCompletionMessageToolCall``) -> the tool message and
    whether the call was well-formed and accepted."""
    try:
        if call.function.name != "calculator":
            raise ValueError(f"unknown tool {call.function.name!r}")
        args = json.loads(call.function.arguments)
        if not isinstance(args, dict) or not isinstance(args.get("expression"), str):
            raise ValueError("arguments must be {\"expression\": string}")
        content, ok = str(safe_eval(args["expression"])), True
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        content, ok = f"error: {exc}", False
    return {"role": "tool", "tool_call_id": call.id, "content": content}, ok


def assistant_message(msg: Any) -> dict[str, Any]:
    """The assistant message as returned, to send back unchanged in the next turn."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name,
                                           "arguments": c.function.arguments}}
                             for c in msg.tool_calls]
    return out


class CalculatorEnvironment(MultiTurnEnvironment):
    """Multi-turn tool use: reward 1.0 for the right number, +0.1 per clean tool-call turn."""

    def __init__(self, group_size: int = 4, max_turns: int = 4, max_tokens: int = 48,
                 temperature: float = 1.0, timeout_s: float = 120.0, pool: int = 0,
                 selection: bool = False) -> None:
        """``pool`` > 0: the problems are a fixed set of that many, drawn again and again
        (seeded), so a problem's statistics accumulate; ``selection``: draw by difficulty
        (``gspo_rl.client.selection``: problems every episode solves, or fails, less often)."""
        self.group_size = group_size
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.problems = [self.make_task(random.Random(f"calculator/{i}")) for i in range(pool)]
        self.selection = TaskSelection() if selection else None

    @staticmethod
    def make_task(rng: random.Random) -> CalculatorTask:
        a, b, c = (rng.randint(2, 50) for _ in range(3))
        form = rng.choice(["{a} + {b} * {c}", "({a} + {b}) * {c}", "{a} * {b} - {c}",
                           "{a} - {b} + {c}"])
        expression = form.format(a=a, b=b, c=c)
        return CalculatorTask(expression=expression, answer=safe_eval(expression))

    def sample_task(self, rng: random.Random) -> CalculatorTask:
        return rng.choice(self.problems) if self.problems else self.make_task(rng)

    def group_metadata(self, task: CalculatorTask) -> dict[str, Any]:
        return {"task": "calculator", "expression": task.expression, "answer": task.answer,
                "task_id": task.expression}

    async def episode(self, task: CalculatorTask, session: EpisodeSession) -> EpisodeResult:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {task.expression}?"}]
        turn_rewards: list[float] = []
        answer: float | None = None
        async with AsyncOpenAI(base_url=session.openai_base_url,
                               api_key=session.api_key or "unused", timeout=self.timeout_s,
                               max_retries=2) as client:
            for turn in range(self.max_turns):
                # (messages and tools: plain dicts, the shapes of openai's TypedDicts)
                response = await client.chat.completions.create(
                    model=session.model,
                    messages=cast("list[ChatCompletionMessageParam]", messages),
                    tools=[cast("ChatCompletionToolParam", CALCULATOR_TOOL)],
                    max_tokens=self.max_tokens, temperature=self.temperature,
                    extra_body=session.extra_body)
                msg = response.choices[0].message
                messages.append(assistant_message(msg))
                if msg.tool_calls:
                    results = [run_tool_call(c) for c in msg.tool_calls]
                    messages.extend(m for m, _ in results)
                    turn_rewards.append(TOOL_BONUS if all(ok for _, ok in results) else 0.0)
                    continue
                turn_rewards.append(0.0)
                answer = last_number(msg.content or "")
                if answer is not None:
                    break
                if turn + 1 < self.max_turns:
                    messages.append({"role": "user", "content": NUDGE})
        correct = answer is not None and abs(answer - task.answer) < 1e-9
        return EpisodeResult(reward=1.0 if correct else 0.0, turn_rewards=turn_rewards)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    env = CalculatorEnvironment(group_size=args.group_size, max_turns=args.max_turns)
    run_and_print(env, args.url, args.groups, api_key=args.api_key,
                  concurrency=args.concurrency)


if __name__ == "__main__":
    main()
