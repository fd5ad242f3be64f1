"""Field types and schema keywords of the request bodies (``gspo_rl.server.rollouts.protocol``).

Bodies are strict (a string is no number, ``true`` is no integer), with one exception JSON
itself makes: a number with no fractional part is an integer (``Int``). ``doc_only`` states in
the schema a bound that a check of the rollout layer enforces, with a message that says why
(e.g. "temperature 0 (greedy decoding) is refused: ..."), so the document says what the
server accepts without losing the explanation; ``not_null`` takes ``null`` out of a field's
schema where the body refuses it.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

from pydantic import BeforeValidator, Field


def doc_only(**keywords: Any) -> Any:
    """Field keywords the JSON schema states and a check of the rollout layer enforces (with
    a message that says why: ``gspo_rl.server.rollouts.sampling`` and the serving modules)."""
    return Field(json_schema_extra=keywords)


def not_null(**keywords: Any) -> Any:
    """The field's schema without its ``null`` option (a null is refused: omit the field),
    plus ``keywords``."""
    def edit(schema: dict[str, Any]) -> None:
        options = [o for o in schema.pop("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            schema.update(options[0])
        elif options:
            schema["anyOf"] = options
        schema.pop("default", None)
        schema.update(keywords)
    return Field(json_schema_extra=edit)


def _integral(value: Any) -> Any:
    """A float with no fractional part is that integer (JSON has one number type: 2.0 is 2);
    anything else goes to the strict check as it is (``"2"`` and ``true`` are refused)."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]
"""A strict integer that takes an integral JSON number (2.0) but no string or boolean."""


def int_in(**bounds: int) -> Any:
    """``Int`` with bounds (``ge``, ``lt``...): the bounds bind the integer before the
    conversion wraps it, so the schema says ``minimum``, not pydantic's own ``ge``."""
    # (pydantic's Field overloads cannot match **kwargs of one type: they are its bounds)
    return Annotated[int, Field(**cast("dict[str, Any]", bounds)), BeforeValidator(_integral)]
