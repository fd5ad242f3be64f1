"""Text <-> openenv JSON: how the model's reply becomes an action, how an observation becomes
the next user message.

``resolve_action`` and ``resolve_observation`` read the server's ``/schema`` once (in ``load``)
and settle the format, refusing with a ``ValueError`` what the schema does not allow;
``ActionCodec.encode`` turns a reply into an action dict, raising ``InvalidAction`` (a turn,
not a crash) when a JSON action has no parsable object; ``render`` turns an observation dict
into text. Pure: no I/O, no openenv import.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

ACTION_BASE = frozenset({"metadata"})  # openenv's Action base field
OBSERVATION_BASE = frozenset({"done", "reward", "metadata"})  # sent beside the observation
OBSERVATION_FIELDS = ("prompt", "message", "text", "echoed_message", "content", "observation",
                      "output", "feedback", "response")
"""The observation's text, by default: the first of these string fields it has."""
_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


class InvalidAction(ValueError):
    """The model's reply is no action of this environment: a turn, not a crash."""


def is_string(prop: dict[str, Any]) -> bool:
    """Whether a JSON-schema property takes a string (``Optional[str]`` included)."""
    if prop.get("type") == "string":
        return True
    return any(is_string(p) for p in [*prop.get("anyOf", ()), *prop.get("oneOf", ())]
               if isinstance(p, dict))


def schema_fields(schema: Any, what: str, base: frozenset[str]) -> dict[str, dict[str, Any]]:
    """The properties of the ``what`` schema, the openenv base fields left out."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        raise ValueError(f"openenv: the server's {what} schema has no properties: {schema!r}")
    return {k: v for k, v in props.items() if k not in base and isinstance(v, dict)}


@dataclass(frozen=True)
class ActionCodec:
    """How the model's text becomes an action: ``field``'s value, or (``field`` None) a JSON
    object, validated by the server against its action model (``schema``)."""

    field: str | None
    schema: dict[str, Any]

    def encode(self, text: str) -> dict[str, Any]:
        return {self.field: text} if self.field is not None else parse_json_action(text)

    def hint(self) -> str:
        if self.field is not None:
            return f"Reply with a valid {self.field}."
        return "Reply with one JSON object: the action, matching its JSON schema."

    def system_prompt(self) -> str | None:
        if self.field is not None:
            return None
        fields = {k: v for k, v in self.schema.get("properties", {}).items()
                  if k not in ACTION_BASE}
        shown = {**self.schema, "properties": fields}
        return ("Reply to every message with one JSON object, your action, matching this "
                f"JSON schema:\n{json.dumps(shown, separators=(',', ':'))}")


def parse_json_action(text: str) -> dict[str, Any]:
    """The JSON object in a reply (a fenced block, else from the first ``{`` to the last
    ``}``); ``InvalidAction`` when there is none or it does not parse."""
    fenced = _FENCE.search(text)
    start, end = text.find("{"), text.rfind("}")
    if fenced is None and start < 0:
        raise InvalidAction("no JSON object in the reply")
    body = fenced.group(1) if fenced else text[start:end + 1 if end > start else len(text)]
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidAction(f"not valid JSON ({exc.msg}, char {exc.pos})") from None
    if not isinstance(value, dict):
        raise InvalidAction("the action must be a JSON object")
    return value


def resolve_action(schema: Any, fmt: str, field: str | None) -> ActionCodec:
    """The codec ``action_format`` and ``action_field`` ask for; ValueError when the action
    schema does not allow it."""
    fields = schema_fields(schema, "action", ACTION_BASE)
    if not fields:
        raise ValueError("openenv: the server's action has no field for the model's reply")
    required = set(schema.get("required", ())) - ACTION_BASE
    if fmt == "json":
        if field is not None:
            raise ValueError("openenv: action_field goes with action_format=text, not json")
        return ActionCodec(None, schema)
    if field is None:
        strings = [k for k, p in fields.items() if is_string(p)]
        if len(strings) == 1 and required <= set(strings):
            field = strings[0]
        elif fmt == "text":
            raise ValueError("openenv: action_format=text needs action_field: the action "
                             f"has fields {sorted(fields)}, not one string field")
        else:
            return ActionCodec(None, schema)
    if field not in fields:
        raise ValueError(f"openenv: action_field {field!r} is not a field of the server's "
                         f"action (its fields: {', '.join(sorted(fields))})")
    if required - {field}:
        raise ValueError(f"openenv: the action also requires {sorted(required - {field})}; "
                         "text fills one field: use action_format=json")
    return ActionCodec(field, schema)


def resolve_observation(schema: Any, field: str | None) -> str | None:
    """The observation field the model reads (None: the whole observation as JSON)."""
    fields = schema_fields(schema, "observation", OBSERVATION_BASE)
    if field is not None:
        if field not in fields:
            raise ValueError(f"openenv: observation_field {field!r} is not a field of the "
                             f"server's observation (its fields: {', '.join(sorted(fields))})")
        return field
    return next((k for k in OBSERVATION_FIELDS if k in fields and is_string(fields[k])), None)


def render(observation: Any, field: str | None) -> str:
    """The user message of an observation: ``field``'s text, else the observation as JSON."""
    if field is None:
        return json.dumps(observation, ensure_ascii=False, default=str)
    if not isinstance(observation, dict) or field not in observation:
        raise ValueError(f"openenv: the observation has no {field!r}: {observation!r}"[:500])
    value = observation[field]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
