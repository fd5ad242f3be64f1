"""The ``json_schema`` verifier: the completion holds a JSON value valid under a schema.

The JSON value is the first ```json code block, else the completion itself, else the first
JSON object or array in it. The schema is the verifier's ``schema`` (or ``schema_file``), or,
without one, the task's reference answer (a schema per task). With ``match_answer`` the value
must also equal the reference answer (then the schema is the verifier's). Needs ``jsonschema``
(the ``schema`` extra).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gspo_rl.client.verifiers.base import Verifier

_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


def find_json(text: str) -> tuple[bool, Any]:
    """(found, value): the JSON value of ``text`` (module docstring)."""
    fenced = _FENCE.search(text)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(text.strip())
    for c in candidates:
        try:
            return True, json.loads(c)
        except ValueError:
            pass
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            return True, decoder.raw_decode(text, m.start())[0]
        except ValueError:
            continue
    return False, None


class JsonSchema(Verifier):
    kind = "json_schema"

    def __init__(self, *, schema: Mapping[str, Any] | None = None,
                 schema_file: str | None = None, match_answer: bool = False,
                 **options: Any) -> None:
        super().__init__(**options)
        try:
            import jsonschema
        except ImportError as exc:
            raise ImportError("the json_schema verifier needs jsonschema: pip install "
                              "'gspo-rl-client[schema]'") from exc
        if schema is not None and schema_file is not None:
            raise ValueError("give schema or schema_file, not both")
        if schema_file is not None:
            schema = json.loads(Path(schema_file).read_text())
        if match_answer and schema is None:
            raise ValueError("match_answer needs the verifier's own schema")
        self.schema = dict(schema) if schema is not None else None
        if self.schema is not None:
            jsonschema.validators.validator_for(self.schema).check_schema(self.schema)
        self.match_answer = match_answer

    def judge(self, completion: str, answer: Any,
              task: Mapping[str, Any]) -> tuple[bool, bool]:
        import jsonschema

        schema = self.schema
        if schema is None:
            schema = json.loads(answer) if isinstance(answer, str) else answer
            if not isinstance(schema, dict):
                raise ValueError(f"the task's schema (its answer) is not an object: {answer!r}")
        got = self.extracted(completion)
        found, value = find_json(got) if got is not None else (False, None)
        if not found:
            return False, False
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError:
            return False, True
        except jsonschema.SchemaError as exc:
            raise ValueError(f"invalid JSON schema: {exc.message}") from None
        if self.match_answer:
            expected = json.loads(answer) if isinstance(answer, str) else answer
            return value == expected, True
        return True, True
