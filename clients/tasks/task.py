"""A task from data: its prompt (text or chat messages), its reference answer, where it came
from; and how a record's fields become one (``Fields``).

A record names its prompt by one of ``messages`` (a list of chat messages), ``prompt``,
``question``, ``problem`` or ``input``, and its answer by one of ``answer``, ``reference``,
``target``, ``solution`` or ``output``, unless ``Fields`` names them. ``template`` builds the
prompt from any of the record's fields (``"Q: {question}\\nA:"``); ``system_prompt`` is put
first in a chat prompt. An answer may be any JSON value (a list: several acceptable answers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROMPT_FIELDS = ("messages", "prompt", "question", "problem", "input")
ANSWER_FIELDS = ("answer", "reference", "target", "solution", "output")
ID_FIELDS = ("id", "task_id", "uid")


@dataclass(frozen=True)
class Task:
    """One task. ``messages`` (chat) or ``prompt`` (text); ``record``: the row's fields."""

    id: str
    source: str
    answer: Any
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    record: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def chat(self) -> list[dict[str, Any]]:
        """The prompt as chat messages."""
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]


@dataclass(frozen=True)
class Fields:
    """Which fields of a record hold what; None: the first of the usual names present."""

    prompt: str | None = None
    answer: str | None = None
    id: str | None = None
    template: str | None = None
    system_prompt: str | None = None


def _pick(record: Mapping[str, Any], name: str | None, usual: tuple[str, ...],
          what: str) -> str:
    if name is not None:
        if name not in record:
            raise ValueError(f"the record has no field {name!r} ({what}); its fields: "
                             f"{sorted(record)}")
        return name
    for candidate in usual:
        if candidate in record:
            return candidate
    raise ValueError(f"the record names no {what} field (one of {list(usual)}); its fields: "
                     f"{sorted(record)}: name it (prompt_field / answer_field)")


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in value):
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    return [dict(m) for m in value]


def make_task(record: Mapping[str, Any], index: int, source: str, fields: Fields) -> Task:
    """The task of one record (``index``: its position, the id when it has none)."""
    answer = record[_pick(record, fields.answer, ANSWER_FIELDS, "answer")]
    id_field = fields.id or next((f for f in ID_FIELDS if f in record), None)
    task_id = str(record[id_field]) if id_field and id_field in record else str(index)
    if fields.template is not None:
        try:
            prompt: Any = fields.template.format(**record)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"template {fields.template!r}: {exc!r} (fields: "
                             f"{sorted(record)})") from None
        name = None
    else:
        name = _pick(record, fields.prompt, PROMPT_FIELDS, "prompt")
        prompt = record[name]
    messages = None
    if isinstance(prompt, list) or name == "messages":
        messages, prompt = _messages(prompt), None
    elif not isinstance(prompt, str) or not prompt:
        raise ValueError(f"the prompt must be a non-empty string, got {prompt!r}")
    if fields.system_prompt:
        chat = messages if messages is not None else [{"role": "user", "content": prompt}]
        if chat[0].get("role") != "system":
            messages = [{"role": "system", "content": fields.system_prompt}, *chat]
    return Task(id=task_id, source=source, answer=answer, prompt=prompt, messages=messages,
                record=dict(record))


def make_tasks(records: list[dict[str, Any]], source: str, fields: Fields) -> list[Task]:
    """Every record's task; ValueError naming the first bad record."""
    tasks = []
    for i, r in enumerate(records):
        try:
            tasks.append(make_task(r, i, source, fields))
        except ValueError as exc:
            raise ValueError(f"source {source!r}, record {i}: {exc}") from None
    if not tasks:
        raise ValueError(f"source {source!r} has no records")
    return tasks
