"""mkdocs hooks: the pages that are generated from the code, so they cannot go stale.

- ``<!-- gspo:config dotted.path.Model -->`` in a page becomes the reference table of that
  pydantic model's fields: name, type, default, environment variable, CLI flag and the field's
  docstring, read from the model class itself (the attribute docstrings, also for models
  without ``use_attribute_docstrings``).
- ``<!-- gspo:openapi -->`` becomes the API reference of ``docs/openapi.json`` (routes,
  parameters, bodies, statuses, then every schema). That file is checked against the code by
  ``tests/server/api/test_openapi.py``.
- ``benchmarks/record.md`` is added as a page holding the repository's ``BENCHMARKS.md``
  (mkdocs reads only ``docs/``).

Run by ``mkdocs build`` (``hooks:`` in mkdocs.yml) in the project's venv: it imports
``gspo_rl`` (the config models import without torch, FastAPI or Redis).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File
from pydantic import BaseModel

REPO = Path(__file__).resolve().parent.parent
# Markers stand alone on their line (a marker quoted inside a sentence is left as it is).
CONFIG_MARK = re.compile(r"^<!-- gspo:config ([\w.]+) -->$", re.M)
OPENAPI_MARK = re.compile(r"^<!-- gspo:openapi -->$", re.M)
BENCHMARKS_PAGE = "benchmarks/record.md"

# How each model is reached from outside: environment variables and the TOML table.
# ServerSettings is a pydantic-settings model (GSPO_ prefix, "__" for nested models);
# LearnerConfig is read from TOML and flags, and ``gspo learn`` reads these two itself
# (gspo/cli/app.py).
LEARNER_ENV = {"admin_key": "GSPO_ADMIN_KEY", "redis_url": "GSPO_REDIS_URL"}


# ------------------------------------------------------------------ mkdocs events


def on_files(files: Any, config: Any) -> Any:
    text = (REPO / "BENCHMARKS.md").read_text()
    text = text.replace("# Benchmarks", "# Benchmarks: the full record", 1)
    files.append(File.generated(config, BENCHMARKS_PAGE, content=text))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = CONFIG_MARK.sub(lambda m: config_reference(m.group(1)), markdown)
    if OPENAPI_MARK.search(markdown):
        spec = json.loads((REPO / "docs" / "openapi.json").read_text())
        markdown = OPENAPI_MARK.sub(lambda m: openapi_reference(spec), markdown)
    return markdown


# ------------------------------------------------------------------ configuration


def _text(text: str, outside_code: dict[str, str] | None = None) -> str:
    """Docstring text as Markdown: RST literals as code; outside code, ``<`` as an entity
    and the ``outside_code`` replacements."""
    swaps = {"<": "&lt;", **(outside_code or {})}
    parts = text.replace("``", "`").split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        for old, new in swaps.items():
            parts[i] = parts[i].replace(old, new)
    return "`".join(parts)


def _cell(text: str) -> str:
    """One Markdown table cell: a single line, pipes escaped outside code spans (inside them
    the tables extension keeps a pipe in its cell, and would show an escape as written)."""
    return _text(re.sub(r"\s+", " ", text).strip(), {"|": "\\|"})


def attribute_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a class and its bases (the string after ``name: type = ...``)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ in ("builtins",) or not klass.__module__.startswith("gspo_rl"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if annotation is type(None):
        return "None"
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(annotation, "__name__", str(annotation))


def default_text(info: Any) -> str:
    if info.is_required():
        return "required"
    factory = info.default_factory
    if factory is not None:
        if isinstance(factory, type) and issubclass(factory, BaseModel):
            return f"a `{factory.__name__}` (below)"
        if factory in (dict, list, set, tuple):
            return f"`{factory()!r}`"
        return f"`{factory.__name__}()`"  # computed at start (e.g. from the host's name)
    default = info.default
    if isinstance(default, Path):
        default = str(default)
    return f"`{default!r}`"


def _cli_flags() -> dict[str, dict[str, str]]:
    """Model name -> {dotted field path: ``--flag``}, from the CLI's own mapping."""
    from gspo_rl.cli import options

    serve = {**options.SERVE, **options.SERVE_AFTER_VLLM_ARG}
    flag: dict[str, dict[str, str]] = {"ServerSettings": {}, "LearnerConfig": {},
                                       "SFTConfig": {}}
    for name, path in serve.items():
        flag["ServerSettings"][path] = "--" + name.replace("_", "-")
    for name, path in options.LEARN.items():
        flag["LearnerConfig"][path] = "--" + name.replace("_", "-")
    for name, path in options.SFT.items():
        flag["SFTConfig"][path] = "--" + name.replace("_", "-")
    return flag


def _rows(model: type, prefix: str, env_prefix: str | None, flags: dict[str, str],
          nested: list[tuple[str, type]]) -> list[str]:
    docs = attribute_docs(model)
    rows = []
    for name, info in model.model_fields.items():
        path = prefix + name
        annotation = info.annotation
        if hasattr(annotation, "model_fields"):
            nested.append((path, annotation))
        if env_prefix is not None:
            env = env_prefix + path.replace(".", "__").upper()
        else:
            env = LEARNER_ENV.get(path, "")
        where = " ".join(x for x in (f"`{env}`" if env else "",
                                     f"`{flags[path]}`" if path in flags else "") if x)
        doc = info.description or docs.get(name, "")
        rows.append(f"| `{path}` | `{_cell(type_name(annotation))}` | {_cell(default_text(info))}"
                    f" | {where or '-'} | {_cell(doc)} |")
    return rows


def config_reference(dotted: str) -> str:
    """The reference of one config model (and of the models its fields hold) as Markdown."""
    module, _, name = dotted.rpartition(".")
    model = getattr(importlib.import_module(module), name)
    env_prefix = model.model_config.get("env_prefix") if hasattr(model, "model_config") else None
    nested_delim = model.model_config.get("env_nested_delimiter")
    if env_prefix is not None and nested_delim != "__":  # the rows assume "__"
        raise ValueError(f"{dotted}: unexpected env_nested_delimiter {nested_delim!r}")
    flags = _cli_flags().get(name, {})
    out = [f"Model: `{dotted}`. {_cell(inspect.getdoc(model) or '')}", ""]
    header = ["| field | type | default | env var / flag | description |",
              "|---|---|---|---|---|"]
    nested: list[tuple[str, type]] = []
    out += header + _rows(model, "", env_prefix, flags, nested)
    for path, sub in nested:
        out += ["", f"Fields of `{path}` (`{sub.__module__}.{sub.__name__}`). "
                f"{_cell(inspect.getdoc(sub) or '')}", ""]
        out += header + _rows(sub, path + ".", env_prefix, flags, [])
    return "\n".join(out)


# ------------------------------------------------------------------ OpenAPI


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def schema_type(schema: dict[str, Any]) -> str:
    """A JSON schema as a short Markdown type: links to named schemas, unions with "or"."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(schema_type(s) for s in schema[key])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {schema_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {schema_type(schema['additionalProperties'])}"
    return f"`{kind}`"


CONSTRAINTS = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">",
               "exclusiveMaximum": "<", "minLength": "length >=", "maxLength": "length <=",
               "minItems": "items >=", "maxItems": "items <=", "pattern": "matches"}


def constraints(schema: dict[str, Any]) -> str:
    parts = []
    for s in [schema, *schema.get("anyOf", []), *schema.get("oneOf", [])]:
        for key, word in CONSTRAINTS.items():
            if key in s:
                parts.append(f"{word} `{s[key]}`")
        if "default" in s and s is schema:
            parts.append(f"default `{json.dumps(s['default'])}`")
    return ", ".join(dict.fromkeys(parts))


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    out = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        out += [f"**{op['summary']}**" + (f". {_cell(op['description'])}"
                                          if op.get("description") else ""), ""]
    auth = "`Authorization: Bearer <key>`" if op.get("security") else "none"
    out += [f"Authentication: {auth}.", ""]
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            sch = p.get("schema", {})
            desc = " ".join(x for x in (p.get("description", ""), constraints(sch)) if x)
            out.append(f"| `{p['name']}` | {p['in']} | {_cell(schema_type(sch))} | "
                       f"{'yes' if p.get('required') else 'no'} | {_cell(desc)} |")
        out.append("")
    body = op.get("requestBody")
    if body:
        for ctype, content in body.get("content", {}).items():
            sch = content.get("schema", {})
            extra = constraints(sch)
            for s in sch.get("oneOf", []) + sch.get("anyOf", []):
                extra = ", ".join(x for x in (extra, constraints(s)) if x)
            out += [f"Request body (`{ctype}`): {schema_type(sch)}"
                    + (f" ({extra})" if extra else "") + ".", ""]
    out += ["| status | meaning | body |", "|---|---|---|"]
    for status, resp in op.get("responses", {}).items():
        content = resp.get("content", {})
        kinds = [f"{schema_type(c['schema'])}" if c.get("schema") else f"`{t}`"
                 for t, c in content.items()]
        out.append(f"| {status} | {_cell(resp.get('description', ''))} | "
                   f"{_cell(' or '.join(kinds)) or '-'} |")
    return out + [""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name}", ""]
    if schema.get("description"):
        out += [_cell(schema["description"]), ""]
    props = schema.get("properties", {})
    if not props:
        return out + [f"Type: {schema_type(schema)}.", ""]
    required = set(schema.get("required", []))
    out += ["| field | type | required | description |", "|---|---|---|---|"]
    for prop, sch in props.items():
        desc = " ".join(x for x in (sch.get("description", ""), constraints(sch)) if x)
        out.append(f"| `{prop}` | {_cell(schema_type(sch))} | "
                   f"{'yes' if prop in required else 'no'} | {_cell(desc)} |")
    if schema.get("additionalProperties") is False:
        out += ["", "Other fields are refused (422)."]
    return out + [""]


def openapi_reference(spec: dict[str, Any]) -> str:
    info = spec.get("info", {})
    out = [f"Generated from `docs/openapi.json`: {info.get('title', '')} "
           f"{info.get('version', '')}, OpenAPI {spec.get('openapi', '')}.", "",
           "## Routes", ""]
    for path in sorted(spec.get("paths", {}), key=lambda p: (not p.startswith("/v1"), p)):
        for method, op in spec["paths"][path].items():
            out += _operation(path, method, op)
    out += ["## Schemas", ""]
    for name, schema in sorted(spec.get("components", {}).get("schemas", {}).items()):
        out += _schema(name, schema)
    return "\n".join(out)
