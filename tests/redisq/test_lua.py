"""Named Lua slots (``gspo_rl.redisq.lua``): a caller's mapping becomes KEYS and ARGV in
the declared order, a missing, unknown or misplaced name is refused before Redis sees it, and
the script body reads each slot by its name (against a real redis-server)."""

from __future__ import annotations

import pytest
import redis

from gspo_rl.redisq import episodes, groups, inflight, ready
from gspo_rl.redisq.episodes import scripts as episode_scripts
from gspo_rl.redisq.groups import rewards as reward_scripts
from gspo_rl.redisq.groups import scripts as group_scripts
from gspo_rl.redisq.lua import LuaScript, template_args
from gspo_rl.redisq.ready import scripts as ready_scripts

ECHO = LuaScript(keys=("a_key", "b_key?"), args=("x", "y", "z", "w?"), rest="items",
                 body="return {a_key, b_key or '', x, y, z, w or '',"
                      " math.max(0, #ARGV - items_at + 1)}")


def test_slots_follow_the_declared_order() -> None:
    keys, args = ECHO.slots(keys={"b_key": "B", "a_key": "A"},
                            args={"z": 3, "x": 1, "y": 2, "w": 4}, rest=["i", "j"])
    assert keys == ["A", "B"] and args == [1, 2, 3, 4, "i", "j"]


def test_optional_slots_may_be_left_out_at_the_end() -> None:
    assert ECHO.slots(keys={"a_key": "A"}, args={"x": 1, "y": 2, "z": 3}) == (
        ["A"], [1, 2, 3])


@pytest.mark.parametrize("call", [
    {"keys": {}, "args": {"x": 1, "y": 2, "z": 3}},  # a missing key
    {"keys": {"a_key": "A", "c_key": "C"}, "args": {"x": 1, "y": 2, "z": 3}},  # unknown key
    {"keys": {"a_key": "A"}, "args": {"x": 1, "z": 3}},  # a missing argument
    {"keys": {"a_key": "A"}, "args": {"x": 1, "y": 2, "z": 3, "v": 0}},  # unknown argument
    {"keys": {"a_key": "A"}, "args": {"x": 1, "y": 2, "z": 3}, "rest": ["i"]},  # rest after
])                                                                  # an omitted optional
def test_a_wrong_name_is_refused(call: dict) -> None:
    with pytest.raises(ValueError):
        ECHO.slots(**call)


def test_constants_stand_for_a_run_of_arguments() -> None:
    run = ECHO.constants(y=2, z=3)
    keys, args = ECHO.slots(keys={"a_key": "A"}, args={"x": 1, "w": 4}, constants=run)
    assert keys == ["A"] and args[0] == 1 and args[1] is run.encoded and args[2] == 4
    with pytest.raises(ValueError):
        ECHO.constants(x=1, z=3)  # not consecutive
    with pytest.raises(ValueError):
        ECHO.slots(keys={"a_key": "A"}, args={"x": 1, "y": 2, "w": 4}, constants=run)


def test_a_required_slot_after_an_optional_one_is_a_definition_error() -> None:
    with pytest.raises(ValueError):
        LuaScript(keys=("a?", "b"), args=(), body="return 1")


def test_template_args_name_a_templates_two_halves() -> None:
    assert template_args("r", ["gspo:rollout:", ""]) == {"r_head": "gspo:rollout:",
                                                         "r_tail": ""}


def test_the_body_reads_slots_by_name(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        script = client.register_script(ECHO.source)
        keys, args = ECHO.slots(keys={"a_key": "A"}, args={"x": "1", "y": "2", "z": "3"},
                                constants=None, rest=[])
        assert script(keys=keys, args=args) == [b"A", b"", b"1", b"2", b"3", b"", 0]
        keys, args = ECHO.slots(keys={"a_key": "A", "b_key": "B"},
                                args={"x": "1", "y": "2", "z": "3", "w": "4"}, rest=["p", "q"])
        assert script(keys=keys, args=args) == [b"A", b"B", b"1", b"2", b"3", b"4", 2]
    finally:
        client.close()


def test_every_protocol_script_loads_and_names_no_positional_slot(redis_url: str) -> None:
    """Each script compiles in Redis; its body reads no ``KEYS[n]``/``ARGV[n]`` by number (the
    variable part is read from ``<rest>_at``)."""
    assert groups and episodes and ready and inflight  # the packages import
    scripts = {name: obj for module in (group_scripts, reward_scripts, episode_scripts,
                                        ready_scripts, inflight)
               for name, obj in vars(module).items() if isinstance(obj, LuaScript)}
    assert len(scripts) == 15, sorted(scripts)  # with PUBLISH_PENDING (inflight)
    client = redis.Redis.from_url(redis_url)
    try:
        for name, script in scripts.items():
            assert client.script_load(script.source), name
            body = script.body
            for n in range(1, 30):
                assert f"KEYS[{n}]" not in body and f"ARGV[{n}]" not in body, (name, n)
    finally:
        client.close()
