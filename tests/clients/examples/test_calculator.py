"""The calculator example's pieces that need no server: the arithmetic evaluator (no eval),
the answer parser, tool-call execution on the openai client's own types, task sampling."""

from __future__ import annotations

import random

import pytest
from openai.types.chat import ChatCompletionMessageToolCall

from gspo_rl.client.examples.calculator import (
    CalculatorEnvironment,
    last_number,
    run_tool_call,
    safe_eval,
)


@pytest.mark.parametrize(("expr", "value"), [
    ("2 + 3", 5), ("(17 + 4) * 3", 63), ("7 / 2", 3.5), ("8 / 2", 4), ("-3 ** 2", -9),
    ("7 // 2 + 7 % 2", 4), ("2 ** 10", 1024), ("1.5 * 2", 3), ("+4 - -4", 8),
])
def test_safe_eval_computes_arithmetic(expr: str, value: float) -> None:
    assert safe_eval(expr) == value


@pytest.mark.parametrize("expr", [
    "__import__('os')", "open('x')", "a + 1", "(1).real", "[1, 2]", "1 if 1 else 2",
    "True + 1", "'a' * 3", "1 / 0", "2 ** 1000", "9 ** 9 ** 9", "10 ** 19", "1 +",
    "1" * 300, "(-8) ** 0.5", "lambda: 1",
])
def test_safe_eval_refuses_everything_else(expr: str) -> None:
    with pytest.raises(ValueError):
        safe_eval(expr)


def test_last_number() -> None:
    assert last_number("so 2 + 3 = 5.") == 5.0
    assert last_number("it is -12.5 or maybe 7") == 7.0
    assert last_number("no digits here") is None


def _call(name: str, arguments: str) -> ChatCompletionMessageToolCall:
    return ChatCompletionMessageToolCall(
        id="call_1", type="function", function={"name": name, "arguments": arguments})


def test_run_tool_call() -> None:
    msg, ok = run_tool_call(_call("calculator", '{"expression": "6 * 7"}'))
    assert ok and msg == {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    for call in (_call("calculator", "not json"), _call("calculator", '{"expr": "1"}'),
                 _call("search", '{"expression": "1"}'),
                 _call("calculator", '{"expression": "x"}')):
        msg, ok = run_tool_call(call)
        assert not ok and msg["content"].startswith("error: ")


def test_tasks_have_exact_integer_answers() -> None:
    env = CalculatorEnvironment()
    rng = random.Random(0)
    for _ in range(50):
        task = env.sample_task(rng)
        assert isinstance(task.answer, int) and safe_eval(task.expression) == task.answer
