"""The OpenAPI document, made to say exactly what this server accepts.

FastAPI writes the document from the request models; ``install_openapi(app, settings)``
finishes it, once, on first use:

- integer bounds as written in the models: FastAPI passes every bound through a float, and a
  float near 2^63 cannot tell the bound from its neighbours (a ``seed`` of -2^63 - 1 read as
  valid against ``-9.223372036854776e18``), so integral bounds past 2^53 are ints again;
- this server's limits, where the models can only say "a server's limit": ``n`` (``max_n``),
  ``max_tokens`` / ``max_completion_tokens``, the top log-probs (``max_top_logprobs``), a
  group's ``size`` (``queue.max_group_size``); once the engine is up, the vocabulary (token
  ids) and the served model's name (``model``: another name is a 404);
- the components the models refer to by name (``MetadataValue``).

What no schema can say stays a check with its own 4xx: a prompt longer than the context, a
body over ``max_body_bytes`` (413), nesting deeper than 64 levels or invalid text (400),
metadata nested deeper than 16 levels or over 64 KiB packed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI

from gspo_rl.server.config import ServerSettings
from gspo_rl.server.rollouts.limits import LOCAL_REF, METADATA_VALUE, METADATA_VALUE_SCHEMA

_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_SAMPLING = ("ChatCompletionRequest", "CompletionRequest", "RolloutRequest")
_TOP_LOGPROBS = {"ChatCompletionRequest": "top_logprobs", "CompletionRequest": "logprobs",
                 "RolloutRequest": "top_logprobs"}
_TOKEN_IDS = {"CompletionRequest": "prompt", "RolloutRequest": "prompt_token_ids"}


def _nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every object of a JSON document, depth first."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            yield n
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)


def exact_bounds(doc: dict[str, Any]) -> None:
    """Integral float bounds past 2^53 back to ints (the models' are ints: FastAPI's
    document model made them floats)."""
    for node in _nodes(doc):
        for key in _BOUNDS:
            v = node.get(key)
            if isinstance(v, float) and v.is_integer() and abs(v) >= 2**53:
                node[key] = int(v)


def resolve_local_refs(doc: dict[str, Any]) -> None:
    """``{"x-component": name}`` (``gspo_rl.server.rollouts.limits.LOCAL_REF``) to ``$ref``s,
    and the components they name added."""
    doc.setdefault("components", {}).setdefault("schemas", {})[METADATA_VALUE] = (
        copy.deepcopy(METADATA_VALUE_SCHEMA))
    for node in _nodes(doc):
        name = node.pop(LOCAL_REF, None)
        if name is not None:
            node["$ref"] = f"#/components/schemas/{name}"


def apply_limits(doc: dict[str, Any], settings: ServerSettings, vocab_size: int | None = None,
                 model_name: str | None = None) -> None:
    """This server's limits in the request schemas (see the module docstring)."""
    schemas = doc["components"]["schemas"]
    for name in _SAMPLING:
        props = schemas[name]["properties"]
        props["n"]["maximum"] = settings.max_n
        for field in ("max_tokens", "max_completion_tokens"):
            if field in props:
                props[field]["maximum"] = settings.max_tokens
        props[_TOP_LOGPROBS[name]]["maximum"] = settings.max_top_logprobs
        if vocab_size is not None and name in _TOKEN_IDS:
            for node in _nodes(props[_TOKEN_IDS[name]]):
                if node.get("type") == "integer":
                    node["maximum"] = vocab_size - 1
        if model_name is not None:
            props["model"]["enum"] = [model_name] + ([None] if name == "RolloutRequest" else [])
    schemas["OpenGroupIn"]["properties"]["size"]["maximum"] = settings.queue.max_group_size


def install_openapi(app: FastAPI, settings: ServerSettings) -> None:
    """``app.openapi()`` finished as the module docstring says (the engine's parts once the
    lifespan has made the tokenizer: the running server's ``/openapi.json``)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = generate()
        exact_bounds(doc)
        resolve_local_refs(doc)
        tokenizer = getattr(app.state, "tokenizer", None)
        apply_limits(doc, settings, None if tokenizer is None else len(tokenizer),
                     None if tokenizer is None else settings.model_name)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
