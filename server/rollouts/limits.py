"""Bounds on what a request may carry that the rollout layer checks: metadata values msgpack
stores and the learner reads back unchanged (and their schema), a group's size, the stop
strings, the lowest temperature; and the JSON walk both this layer and the HTTP layer's body
check use. Pure: no I/O, no HTTP
(refusals are ``RolloutError``; ``check_metadata`` raises ``ValueError`` inside validation)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, cast

import msgpack
from pydantic import AfterValidator, WithJsonSchema

from gspo_rl.server.rollouts.errors import Problem, RolloutError

MAX_STOP_STRINGS = 16
MIN_TEMPERATURE = 1e-3
"""Lower: greedy, or so close to it that logits / temperature overflow (5e-324 sampled a token
with a NaN log-probability, recorded for training): refused."""
MAX_METADATA_DEPTH = 16
MAX_METADATA_BYTES = 64 * 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
METADATA_VALUE = "MetadataValue"
LOCAL_REF = "x-component"
"""A reference to a component of the OpenAPI document by name, written so that pydantic does
not try to resolve it (``gspo_rl.server.api.openapi`` turns it into a ``$ref``)."""
METADATA_VALUE_SCHEMA: dict[str, Any] = {"anyOf": [
    {"type": "null"}, {"type": "boolean"}, {"type": "string"},
    {"type": "number", "minimum": INT64_MIN, "exclusiveMaximum": 2**63},
    {"type": "array", "items": {LOCAL_REF: METADATA_VALUE}},
    {"type": "object", "additionalProperties": {LOCAL_REF: METADATA_VALUE}},
], "description": "A metadata value: JSON, numbers in [-2^63, 2^63) (msgpack stores them and "
   "the learner reads them back unchanged), nested at most 16 levels, 64 KiB packed in all."}
"""The schema of a metadata value, a component of the OpenAPI document
(``gspo_rl.server.api.openapi`` adds it; ``Metadata`` refers to it)."""


def _bad_string(s: str) -> bool:
    """True for a string UTF-8 cannot encode (a lone surrogate from a ``\\udXXX`` escape)."""
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _children(value: Any) -> Sequence[Any] | None:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, list):
        return value
    return None


_CONTAINERS = (dict, list)
_WALKED = (dict, list, str)
def json_problem(value: Any, max_depth: int, check_strings: bool = True) -> str | None:
    """Why ``value`` (parsed JSON) is refused: too deep or a string that is not valid text;
    None when it is fine. Iterative, so a deep value cannot overflow the stack here; scalars
    other than strings are skipped at C speed (a body can hold a million token ids)."""
    walked = _WALKED if check_strings else _CONTAINERS
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if v.__class__ is str:
            if _bad_string(v):
                return f"a string is not valid UTF-8 text (lone surrogate): {ascii(v[:40])}"
            continue
        if v.__class__ not in _CONTAINERS:
            continue
        kids = cast("Sequence[Any]", _children(v)) if check_strings else (  # (a container)
            list(v.values()) if v.__class__ is dict else v)
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels"
        stack.extend([(k, depth + 1) for k in kids if k.__class__ in walked])
    return None


def _metadata_problem(value: Any, depth: int) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if INT64_MIN <= value <= INT64_MAX else f"integer {value} is outside int64"
    if isinstance(value, float):  # the same range as an integer's: the schema's "number"
        if not math.isfinite(value):
            return f"number {value} is not finite"
        return None if INT64_MIN <= value < 2**63 else f"number {value} is outside int64"
    if isinstance(value, str):
        return "a string is not valid UTF-8 text" if _bad_string(value) else None
    kids = _children(value)
    if kids is None:
        return f"unsupported value of type {type(value).__name__}"
    if depth > MAX_METADATA_DEPTH:
        return f"nested deeper than {MAX_METADATA_DEPTH} levels"
    for k in kids:
        problem = _metadata_problem(k, depth + 1)
        if problem:
            return problem
    return None


def check_metadata(value: dict[str, Any]) -> dict[str, Any]:
    """Pydantic after-validator of ``Metadata``: JSON values msgpack stores and the learner
    reads back unchanged, within the size bound. Raises ``ValueError`` (a 422)."""
    json_ok = json_problem(value, MAX_METADATA_DEPTH)  # bounds the recursion below
    problem = json_ok or _metadata_problem(value, 1)
    if problem:
        raise ValueError(f"metadata: {problem}")
    size = len(msgpack.packb(value))
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is {size} bytes packed, over the limit of "
                         f"{MAX_METADATA_BYTES}")
    return value


Metadata = Annotated[dict[str, Any], AfterValidator(check_metadata), WithJsonSchema({
    "type": "object", "additionalProperties": {LOCAL_REF: METADATA_VALUE}})]


def check_group_size(size: int, max_group_size: int) -> None:
    """``POST /v1/groups``: a size over the queue's ``max_group_size`` is a 422 (like a size
    of 0), answered before any id is built."""
    if size > max_group_size:
        raise RolloutError(Problem.UNPROCESSABLE, f"size {size} is over this server's "
                           f"max_group_size of {max_group_size}", code="group_too_large")
