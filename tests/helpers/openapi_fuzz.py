"""Hypothesis strategies from the server's OpenAPI document, plus hostile values, and a small
checker of responses against the document (schemathesis, in test_openapi_exact, checks the
document's own promises; these add the hostile values it does not send).

``body_strategy(doc, schema)`` draws JSON bodies that mostly follow ``schema`` (so requests
get past validation and reach the routes' own code) and, at any node, sometimes a hostile
value instead: deep nesting, integers past int64, NaN/Infinity, lone surrogates, long strings
and lists. ``conforms(doc, schema, value)`` says whether a response body matches a schema
(types, required properties, enums, ``$ref``/``anyOf``/``oneOf``), with the path of the first
mismatch.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

MAX_LEAVES = 6
HOSTILE_STRINGS = ["\ud800", "a\udc00b", "\udfff" * 3, "x" * 20_000, "", "\x00", "é🙂"]
HOSTILE_NUMBERS = [2**64, -(2**63) - 1, 10**40, math.nan, math.inf, -math.inf, 1e308, -0.0]


def _deep(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


HOSTILE: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(HOSTILE_STRINGS),
    st.sampled_from(HOSTILE_NUMBERS),
    st.sampled_from([_deep(20), _deep(80), _deep(600)]),
    st.just(list(range(5000))),
    st.just({f"k{i}": i for i in range(2000)}),
    st.none(),
    st.booleans(),
)

ANY_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                             max_size=3),
    max_leaves=MAX_LEAVES,
)


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = doc["components"]["schemas"][name]
    return schema


def _object(doc: dict[str, Any], schema: dict[str, Any], overrides: dict[str, Any],
            depth: int) -> st.SearchStrategy[Any]:
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    fields = {name: overrides[name] if name in overrides else
              body_strategy(doc, sub, overrides, depth + 1) for name, sub in props.items()}
    req = st.fixed_dictionaries({k: v for k, v in fields.items() if k in required})
    opt = st.fixed_dictionaries({}, optional={k: v for k, v in fields.items()
                                              if k not in required})
    if not props:  # a free-form object (metadata, tool parameters)
        return st.dictionaries(st.text(max_size=5), ANY_JSON, max_size=3)
    return st.tuples(req, opt).map(lambda t: {**t[1], **t[0]})


def _plain(doc: dict[str, Any], schema: dict[str, Any], overrides: dict[str, Any],
           depth: int) -> st.SearchStrategy[Any]:
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        return _object(doc, schema, overrides, depth)
    if kind == "array":
        items = body_strategy(doc, schema.get("items", {}), overrides, depth + 1)
        lo = schema.get("minItems", 0)
        return st.lists(items, min_size=lo, max_size=max(lo, min(schema.get("maxItems", 3), 3)))
    if kind == "string":
        lo = schema.get("minLength", 0)
        return st.text(min_size=lo, max_size=max(lo, min(schema.get("maxLength", 12), 12)))
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum"), max_value=schema.get("maximum"))
    if kind == "number":
        return st.floats(min_value=schema.get("minimum"), max_value=schema.get("maximum"),
                         allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return ANY_JSON


def body_strategy(doc: dict[str, Any], schema: dict[str, Any],
                  overrides: dict[str, Any] | None = None,
                  depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of ``schema`` (a node of ``doc``); one node in ~8 is hostile instead."""
    overrides = overrides or {}
    schema = resolve(doc, schema)
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        normal = st.one_of([body_strategy(doc, o, overrides, depth + 1) for o in options])
    elif depth > 6:
        normal = st.none()
    else:
        normal = _plain(doc, schema, overrides, depth)
    return st.one_of(normal, normal, normal, normal, normal, normal, normal, HOSTILE)


_TYPES: dict[str, Any] = {"object": dict, "array": list, "string": str, "boolean": bool,
                          "null": type(None)}


def conforms(doc: dict[str, Any], schema: dict[str, Any], value: Any,
             path: str = "$") -> str | None:
    """None if ``value`` matches ``schema``; else where and why it does not."""
    schema = resolve(doc, schema)
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        if any(conforms(doc, o, value, path) is None for o in options):
            return None
        return f"{path}: matches none of {len(options)} alternatives"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: {value!r} not in {schema['enum']}"
    kind = schema.get("type")
    if kind in ("integer", "number"):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and (kind == "number" or isinstance(value, int))
    elif kind in _TYPES:
        ok = isinstance(value, _TYPES[kind])
    else:
        ok = True
    if not ok:
        return f"{path}: expected {kind}, got {type(value).__name__}"
    if kind == "object":
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            return f"{path}: missing {missing}"
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                problem = conforms(doc, sub, value[k], f"{path}.{k}")
                if problem:
                    return problem
    if kind == "array":
        for i, item in enumerate(value):
            problem = conforms(doc, schema.get("items", {}), item, f"{path}[{i}]")
            if problem:
                return problem
    return None
