"""The verifiers (gspo_rl.client.verifiers): each kind's rule, its format reward, and a broken
reference answer raising instead of scoring 0.0. Property tests (hypothesis) for the numeric
parser (every way of writing a number reads back exactly) and the normalised match."""

from __future__ import annotations

import threading
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gspo_rl.client.verifiers import Verdict, make_verifier
from gspo_rl.client.verifiers.numeric import find_answer, parse_number
from gspo_rl.client.verifiers.text import normalize


@pytest.mark.timeout(20)
def test_an_exponent_past_the_limit_is_no_number_and_costs_nothing() -> None:
    """A sampled "9e999999999" made exact is a billion-digit integer (it held a math run's event
    loop for minutes): beyond 1e1000 a number is not compared; the last one within is read."""
    assert parse_number("9e999999999") is None
    assert parse_number("1e-999999999") is None
    assert parse_number("1/1e99999999") is None
    assert parse_number("2.5e1000") == Fraction(25) * 10 ** 999
    assert find_answer("it is 7 or 9e999999999") == 7
    assert make_verifier("numeric")("Answer: 1e999999999", "5").correct is False


@pytest.mark.parametrize(("completion", "answer", "correct"), [
    ("So the answer is 42.", "42", True),
    ("#### 1,234", 1234, True),
    ("x = \\boxed{\\frac{3}{4}} and then 9", "0.75", True),
    ("I think 7, no wait, 8", "8", True),
    ("Answer: 12\nBut maybe 13", "12", True),
    ("three and a half: 3.5", 3.5, True),
    ("-5 degrees", "-5", True),
    ("answer: 41", "42", False),
    ("no number here", "5", False),
    ("a GSM8K answer", "He has 3 + 4 = 7 apples.\n#### 7", False),
])
def test_numeric(completion: str, answer: object, correct: bool) -> None:
    assert make_verifier("numeric")(completion, answer).correct is correct


def test_numeric_tolerance_format_reward_and_broken_reference() -> None:
    v = make_verifier("numeric", format_reward=0.1, tolerance=0.01)
    assert v("3.14159", "3.14") == Verdict(1.0, True)
    assert v("Answer: 9", "12") == Verdict(0.1, False)  # a number, the wrong one
    assert v("no idea", "12") == Verdict(0.0, False)
    with pytest.raises(ValueError, match="holds no number"):
        v("12", "n/a")
    with pytest.raises(ValueError, match="format_reward"):
        make_verifier("numeric", format_reward=1.5)
    with pytest.raises(ValueError, match="unknown verifier"):
        make_verifier("fuzzy")
    with pytest.raises(ValueError, match="unexpected keyword"):
        make_verifier("numeric", tolerence=0.1)


@given(st.integers(-10**9, 10**9), st.sampled_from(["{}", "{:,}", "Answer: {}", "#### {}",
                                                     "\\boxed{{{}}}", "so it is {}."]))
def test_every_way_of_writing_an_integer_reads_back(n: int, form: str) -> None:
    assert find_answer("work: 12 + 30\n" + form.format(n)) == n


@given(st.fractions(min_value=-1000, max_value=1000, max_denominator=50))
def test_fractions_read_back_exactly(x: Fraction) -> None:
    assert parse_number(f"{x.numerator}/{x.denominator}") == x
    assert parse_number(f"\\frac{{{x.numerator}}}{{{x.denominator}}}") == x


@given(st.text(alphabet=st.characters(codec="ascii", categories=("L", "N", "Zs", "P")),
               max_size=40))
def test_normalized_ignores_case_spacing_and_punctuation(text: str) -> None:
    v = make_verifier("normalized")
    noisy = "  " + text.upper().replace(" ", "  ") + " !"
    assert v(noisy, text).correct is bool(normalize(text)) or normalize(text) == ""


def test_text_kinds() -> None:
    assert make_verifier("exact")(" Paris ", "Paris").correct
    assert not make_verifier("exact")("paris", "Paris").correct
    assert make_verifier("exact")("b", ["a", "b"]).correct  # several acceptable answers
    assert make_verifier("normalized")("The Eiffel tower!", "eiffel tower").correct
    assert make_verifier("normalized", contains=True)("It is in Paris, France.", "paris").correct
    extract = make_verifier("exact", extract=r"Answer:\s*(\w+)", format_reward=0.2)
    assert extract("blah Answer: yes", "yes") == Verdict(1.0, True)
    assert extract("blah Answer: no", "yes") == Verdict(0.2, False)
    assert extract("blah", "yes") == Verdict(0.0, False)
    regex = make_verifier("regex", pattern=r"\bcolou?r\b", ignore_case=True)
    assert regex("What a COLOR", None).correct and not regex("colors", None).correct
    assert make_verifier("regex", pattern=r"total: {answer}$")("total: 3.5", "3.5").correct
    assert not make_verifier("regex", pattern=r"total: {answer}$")("total: 305", "3.5").correct
    assert make_verifier("regex")("id-1234", r"id-\d{4}").correct  # the answer is the pattern


def test_math_verify_in_and_out_of_the_main_thread() -> None:
    v = make_verifier("math")
    assert v("we get $\\frac{1}{2}$", "0.5").correct
    assert not v("x = 3", "4").correct
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(v("\\boxed{6}", "6").correct))
    t.start()
    t.join(60)
    assert out == [True]  # its signal-based time limits are off outside the main thread


def test_json_schema(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "required": ["name"]}
    v = make_verifier("json_schema", schema=schema, format_reward=0.1)
    assert v('Here: ```json\n{"name": "x"}\n```', None).correct
    assert v('sure {"name": "x"} done', None).correct
    assert v('{"name": 3}', None) == Verdict(0.1, False)  # JSON, not valid
    assert v("nothing", None) == Verdict(0.0, False)
    per_task = make_verifier("json_schema")  # the answer is the schema
    assert per_task("[1, 2]", {"type": "array", "maxItems": 2}).correct
    f = tmp_path / "s.json"
    f.write_text('{"type": "integer"}')
    assert make_verifier("json_schema", schema_file=str(f))("7", None).correct
    assert make_verifier("json_schema", schema={"type": "integer"}, match_answer=True)(
        "7", 7).correct
    with pytest.raises(Exception, match="is not valid"):
        make_verifier("json_schema", schema={"type": "nonsense"})


def test_python_callable(tmp_path: Path) -> None:
    f = tmp_path / "my_check.py"
    f.write_text("def check(completion, answer, task):\n"
                 "    return len(completion) / 10 if task.get('partial') else "
                 "completion == answer\n"
                 "def bad(completion, answer, task):\n    return 'yes'\n")
    v = make_verifier("python", function=f"{f}:check")
    assert v("abc", "abc") == Verdict(1.0, True)
    assert v("abcde", "x", {"partial": True}) == Verdict(0.5, False)
    assert make_verifier("python", function=f"{f}:check", threshold=0.5)(
        "abcde", "x", {"partial": True}).correct
    with pytest.raises(TypeError, match="return a bool"):
        make_verifier("python", function=f"{f}:bad")("a", "b")
    with pytest.raises(ValueError, match="no such file"):
        make_verifier("python", function="nowhere.py:f")
    assert make_verifier("python", function="json:loads") is not None  # a module's function
