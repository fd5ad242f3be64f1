"""What the run logs write for a group's task: JSON as it is, the fields of a model, a
dataclass or a verifiers ``Task`` (its ``data``), a ``repr`` for the rest; ``gspo up``'s
``env_rewards.jsonl`` caps it."""

from __future__ import annotations

import dataclasses
import json

import pydantic

from gspo_rl.client.runlog import jsonable
from gspo_rl.launch.drive import task_json


class Data(pydantic.BaseModel):
    id: str
    prompt: str
    note: str | None = None


class TaskWithData:  # a verifiers.v1 Task's shape: the default repr, its fields in .data
    def __init__(self, data: Data) -> None:
        self.data = data


@dataclasses.dataclass
class Problem:
    question: str
    answer: int


def test_json_stays_as_it_is() -> None:
    assert jsonable({"q": "2+2", "a": [4]}) == {"q": "2+2", "a": [4]}
    assert jsonable("a task") == "a task"


def test_objects_are_logged_by_their_fields() -> None:
    assert jsonable(Data(id="t-1", prompt="Say a word")) == {"id": "t-1", "prompt": "Say a word"}
    assert jsonable(TaskWithData(Data(id="t-2", prompt="p"))) == {"id": "t-2", "prompt": "p"}
    assert jsonable(Problem("2+2", 4)) == {"question": "2+2", "answer": 4}


def test_what_has_no_fields_is_its_repr() -> None:
    class Named:
        def __repr__(self) -> str:
            return "Named(7)"

    assert jsonable(Named()) == "Named(7)"
    assert jsonable(object()).startswith("<object object at 0x")
    assert jsonable({"a": {1, 2}}) == "{'a': {1, 2}}"


def test_env_rewards_caps_a_large_task() -> None:
    small = task_json(Problem("2+2", 4))
    assert small == {"question": "2+2", "answer": 4}
    big = task_json({"prompt": "x" * 5000})
    assert isinstance(big, str) and len(big) == 1000 and big.startswith('{"prompt": "xxx')
    json.dumps(big)
