"""How ``--env`` specs and ``--env-arg`` items are read (``gspo_rl.client.loading``): a spec's
form, its ``@WEIGHT``, its name; an argument's JSON value, its dotted key, the environment it
addresses; and what is refused, with a message that says why. Pure: nothing is loaded except
where a test says so (the built-in examples and a class in a file of the test's own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gspo_rl.client.examples.alphabet import AlphabetEnvironment
from gspo_rl.client.loading import (
    EnvSpec,
    load_environment,
    nest,
    parse_spec,
    parse_value,
    with_args,
)


@pytest.mark.parametrize(("text", "spec", "weight", "name"), [
    ("alphabet", "alphabet", 1.0, "alphabet"),
    ("calculator@2", "calculator", 2.0, "calculator"),
    ("path/to/my_env.py:MyEnv", "path/to/my_env.py:MyEnv", 1.0, "MyEnv"),
    ("path/to/my_env.py:MyEnv@0.5", "path/to/my_env.py:MyEnv", 0.5, "MyEnv"),
    ("my_package.my_env:MyEnv@3", "my_package.my_env:MyEnv", 3.0, "MyEnv"),
    ("verifiers:math_taskset@2", "verifiers:math_taskset", 2.0, "math_taskset"),
    ("verifiers:/abs/path/gspo_vf_math/", "verifiers:/abs/path/gspo_vf_math/", 1.0,
     "gspo_vf_math"),
    ('verifiers:toy:{"split": "train"}', 'verifiers:toy:{"split": "train"}', 1.0, "toy"),
    ("reasoning-gym:leg_counting:2,basic_arithmetic@1e1",
     "reasoning-gym:leg_counting:2,basic_arithmetic", 10.0, "leg_counting+basic_arithmetic"),
    ("openenv:http://127.0.0.1:8000@4", "openenv:http://127.0.0.1:8000", 4.0, "127.0.0.1:8000"),
    ("openenv:ws://box:9/env", "openenv:ws://box:9/env", 1.0, "box:9"),
    ("textarena:Sudoku-v0-very-easy@2", "textarena:Sudoku-v0-very-easy", 2.0,
     "Sudoku-v0-very-easy"),
])
def test_a_spec_its_weight_and_its_name(text: str, spec: str, weight: float, name: str) -> None:
    parsed = parse_spec(text)
    assert (parsed.spec, parsed.weight, parsed.name) == (spec, weight, name)
    assert parsed.args == {}


@pytest.mark.parametrize("text", ["openenv:http://user@host:8000",
                                  "openenv:http://user:secret@host:8000",
                                  "openenv:http://user@host"])
def test_an_at_inside_a_url_is_no_weight_and_credentials_stay_out_of_the_name(
        text: str) -> None:
    parsed = parse_spec(text)
    assert parsed.spec == text and parsed.weight == 1.0
    assert "@" not in parsed.name and "secret" not in parsed.name  # it names metrics
    assert parsed.name.startswith("host")


@pytest.mark.parametrize(("text", "says"), [
    ("alphabet@0", "must be a finite number > 0"),
    ("alphabet@-1", "must be a finite number > 0"),
    ("alphabet@nan", "must be a finite number > 0"),
    ("alphabet@inf", "must be a finite number > 0"),
    ("alphabet@1e400", "must be a finite number > 0"),
    ("", "name an environment"),
    ("  ", "name an environment"),
    ("@2", "name an environment"),
])
def test_a_bad_spec_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_spec(text)


@pytest.mark.parametrize(("spec", "says"), [
    ("no_such_builtin", "unknown environment 'no_such_builtin'"),
    ("/nowhere/my_env.py:MyEnv", "no such file"),
    ("gspo_rl.client.examples.alphabet:NoSuchClass", "cannot load"),
    ("no_such_package_xyz.env:MyEnv", "cannot load"),
    ("verifiers:", "name what to load after verifiers:"),
])
def test_what_cannot_be_loaded_is_refused_naming_the_spec(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        load_environment(spec)


def test_the_unknown_spec_message_lists_every_form() -> None:
    with pytest.raises(ValueError) as info:
        load_environment("alphabett")
    for form in ("alphabet", "path/to/module.py:EnvClass", "package.module:EnvClass",
                 "verifiers:MODULE", "reasoning-gym:NAME", "openenv:URL", "textarena:GAME_ID"):
        assert form in str(info.value)


MY_ENV = '''
from gspo_rl.client.examples.alphabet import AlphabetEnvironment

class MyEnv(AlphabetEnvironment):
    def __init__(self, group_size: int = 8, level: int = 0, tags=None) -> None:
        super().__init__(group_size=group_size)
        self.level, self.tags = level, tags

INSTANCE = MyEnv(level=7)
NOT_AN_ENV = 3
'''


def test_a_class_in_a_file_takes_the_parsed_arguments(tmp_path: Path) -> None:
    (tmp_path / "my_env.py").write_text(MY_ENV)
    spec = f"{tmp_path / 'my_env.py'}:MyEnv"
    [parsed] = with_args([parse_spec(f"{spec}@2")], ["level=3", 'tags=["a", "b"]'])
    env = load_environment(parsed.spec, group_size=4, args=parsed.args)
    assert (type(env).__name__, env.level, env.tags, env.group_size) == ("MyEnv", 3, ["a", "b"],
                                                                         4)
    assert parsed.weight == 2.0
    with pytest.raises(ValueError, match="does not take these arguments"):
        load_environment(spec, args={"no_such_arg": 1})
    assert load_environment(f"{tmp_path / 'my_env.py'}:INSTANCE").level == 7
    with pytest.raises(ValueError, match="is an instance: it takes no arguments"):
        load_environment(f"{tmp_path / 'my_env.py'}:INSTANCE", args={"level": 1})
    with pytest.raises(ValueError, match="is not a SingleTurnEnvironment or MultiTurnEnv"):
        load_environment(f"{tmp_path / 'my_env.py'}:NOT_AN_ENV")


def test_a_builtin_takes_its_group_size() -> None:
    env = load_environment("alphabet", group_size=3)
    assert isinstance(env, AlphabetEnvironment) and env.group_size == 3


@pytest.mark.parametrize(("raw", "value"), [
    ("3", 3), ("-2", -2), ("1.5", 1.5), ("1e-3", 0.001), ("true", True), ("false", False),
    ('{"a": 1, "b": [2]}', {"a": 1, "b": [2]}), ("[1, 2]", [1, 2]), ('"quoted"', "quoted"),
    ('"3"', "3"), ("word", "word"), ("null", "null"), ("", ""), ("NaN", "NaN"),
    ("Infinity", "Infinity"), ("{not json", "{not json"), ("http://a:1/b", "http://a:1/b"),
])
def test_a_value_is_json_else_the_string_itself(raw: str, value: object) -> None:
    got = parse_value(raw)
    assert got == value and type(got) is type(value)


def test_dotted_keys_nest_and_a_later_value_wins() -> None:
    args: dict = {}
    nest(args, "sampling.max_tokens", 8)
    nest(args, "sampling.temperature", 0.5)
    nest(args, "a.b.c", True)
    nest(args, "seed", 1)
    nest(args, "seed", 2)
    assert args == {"sampling": {"max_tokens": 8, "temperature": 0.5}, "a": {"b": {"c": True}},
                    "seed": 2}


@pytest.mark.parametrize(("items", "says"), [
    (["seed=1", "seed.x=2"], "seed is already set to a value, not a table"),
    (["a..b=1"], "must not be empty"),
    ([".a=1"], "must not be empty"),
    (["a.=1"], "must not be empty"),
    (["alphabet:=1"], "must not be empty"),
    (["no_equals_sign"], "expected key=value"),
    (["=1"], "expected key=value"),
    (["calculator:seed=1"], "no environment is named 'calculator'"),
])
def test_a_bad_argument_is_refused_saying_why(items: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        with_args([parse_spec("alphabet")], items)


def test_one_environment_takes_bare_and_named_arguments() -> None:
    [spec] = with_args([parse_spec("alphabet@2")], ["turns=3", "alphabet:order=random",
                                                    "sampling.max_tokens=4", "empty="])
    assert spec == EnvSpec("alphabet", 2.0, {"turns": 3, "order": "random",
                                             "sampling": {"max_tokens": 4}, "empty": ""})


def test_several_environments_take_arguments_by_name_only() -> None:
    specs = [parse_spec("alphabet@3"), parse_spec("openenv:http://127.0.0.1:8000"),
             parse_spec("reasoning-gym:leg_counting,basic_arithmetic")]
    with_args(specs, ["alphabet:turns=2", "127.0.0.1:8000:max_turns=4",
                      "leg_counting+basic_arithmetic:size=50"])
    assert [s.args for s in specs] == [{"turns": 2}, {"max_turns": 4}, {"size": 50}]
    with pytest.raises(ValueError, match="several environments run; address one as "
                                         "NAME:key=value with NAME one of alphabet, "
                                         "127.0.0.1:8000, leg_counting"):
        with_args(specs, ["seed=1"])
    with pytest.raises(ValueError, match="no environment is named 'calculator'"):
        with_args(specs, ["calculator:seed=1"])
