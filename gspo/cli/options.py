"""``gspo serve``, ``gspo learn``, ``gspo sft`` and ``gspo up`` options, derived from the config
models at run time.

Each option is a field of ``ServerSettings``, ``LearnerConfig``, ``SFTConfig`` or ``UpConfig``
(``SERVE``, ``LEARN``, ``SFT`` and ``UP`` map an option to its field's dotted path); its type,
help text (the field's docstring) and default come from the model, so the CLI cannot drift
from the fields.
The models import without torch, FastAPI or Redis (tests/cli/test_options.py holds that), so
reading them costs the CLI a fraction of a second.

Every option defaults to None ("not passed"): an unset flag leaves the value to the TOML file,
the GSPO_* environment and the field's default, in that model's precedence.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from functools import cache
from typing import Any

SERVE = {name: name for name in (
    "model", "engine", "served_model_name", "host", "port", "redis_url", "key_prefix",
    "api_key", "admin_key", "insecure_no_auth", "device", "max_batch_size", "dtype",
    "max_model_len", "tensor_parallel_size", "gpu_memory_utilization", "max_lora_rank",
    "enforce_eager")}
SERVE_AFTER_VLLM_ARG = {name: name for name in (
    "max_n", "max_tokens", "max_body_bytes", "max_ready_groups", "admission",
    "admission_wait_s", "no_signal_hold_s", "no_signal_drought_s",
    "admission_capacity_without_learner",
    "max_episode_turns",
    "episode_history_rewrite", "tool_call_parser", "reasoning_parser")} | {
    "group_ttl_s": "queue.group_ttl_s", "group_idle_s": "queue.group_idle_s",
    "finished_ttl_s": "queue.finished_ttl_s",
    "dropped_records_ttl_s": "queue.dropped_records_ttl_s",
    "server_id": "server_id",
    "advertise_url": "advertise_url"}
LEARN = {name: name for name in (
    "model", "redis_url", "key_prefix", "consumer")} | {"loss": "loss.kind"} | {
    name: name for name in (
        "old_logprobs", "is_weight_cap", "max_staleness", "groups_per_step", "keep_trained_s",
        "minibatches",
        "epochs", "micro_batch_tokens", "lora_rank", "lora_alpha", "lora_dropout",
        "lora_target_modules", "lr", "weight_decay", "grad_clip", "warmup_steps", "save_dir",
        "save_every", "save_every_s", "keep_last", "resume", "sync_every", "weight_sync",
        "max_steps", "target_reward", "target_window", "drain_timeout_s", "read_timeout_s",
        "device", "param_dtype", "data_parallel", "seed", "metrics_jsonl", "report_to",
        "run_name", "tracking_project", "tracking_dir", "samples_every", "prometheus_port",
        "final_eval_wait_s")}
SFT = {name: name for name in (
    "model", "data", "save_dir", "epochs", "max_steps", "batch_size", "micro_batch_tokens",
    "max_length", "shuffle", "chat_template_kwargs", "sanitize_control_tokens", "lr",
    "lr_schedule", "warmup_steps", "weight_decay", "grad_clip", "device", "param_dtype",
    "packing", "seed", "save_every", "keep_last", "resume", "metrics_jsonl", "report_to",
    "run_name", "tracking_project", "tracking_dir")}
UP = {name: name for name in (
    "run_dir", "model", "redis_url", "loss", "max_steps", "groups_per_step", "group_size",
    "tasks", "env")} | {"env_arg": "env_args"} | {name: name for name in (
        "selection", "no_signal_hold_s", "no_signal_drought_s", "resume", "data", "verifier",
        "eval_every", "lr",
        "lora_rank", "read_timeout_s", "max_staleness", "concurrency", "minutes",
        "target_reward", "seed", "device", "engine", "admission", "report_to", "run_name")}
# ``gspo learn`` and ``gspo up`` read these from the environment (their configs are no
# settings models): the option's ``envvar``.
LEARN_ENV = {"redis_url": "GSPO_REDIS_URL"}
UP_ENV = {"redis_url": "REDIS_URL"}
# gspo up's options given once per value (``--env a --env b``); every other list field is one
# comma-separated value (``--lora-target-modules q_proj,v_proj``), split by its model.
UP_REPEATABLE = frozenset({"env", "env_arg", "data"})
_SECRET_NOTE = " Prefer the environment variable: flags show in `ps`."


def _attribute_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a class (the string right after ``name: type = ...``), for
    models that do not set ``use_attribute_docstrings``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]  # a class's source: a ClassDef
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = nxt.value.value
    return docs


_SECTION = re.compile(r"^\s*# -{8,}\s+(?P<title>\S.*)$")
_ATTRIBUTE = re.compile(r"^    (?P<name>[a-z_][a-z0-9_]*)\s*:")


def _sections(cls: type) -> dict[str, str]:
    """Each field of ``cls`` -> the title of the section comment above it in the class
    (``# ------ batching``); fields before any section: none."""
    from pydantic import BaseModel

    out: dict[str, str] = {}
    for klass in cls.__mro__:  # a field declared in a shared base: that base's section
        if klass is BaseModel or not (isinstance(klass, type) and issubclass(klass, BaseModel)):
            continue
        title = None
        for line in textwrap.dedent(inspect.getsource(klass)).splitlines():
            if (m := _SECTION.match(line)) is not None:
                title = m.group("title").strip()
            elif title is not None and (m := _ATTRIBUTE.match(line)) is not None:
                out.setdefault(m.group("name"), title)
    return out


def _field(model: type, path: str) -> tuple[type, str, Any]:
    """The model class that owns ``path``'s last part, the part, and its FieldInfo."""
    *parents, name = path.split(".")
    for part in parents:
        model = model.model_fields[part].annotation  # type: ignore[attr-defined]  # pydantic models
    return model, name, model.model_fields[name]  # type: ignore[attr-defined]  # a pydantic model


def _type_name(annotation: Any) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _type_name(args[0])
    for t in (bool, int, float):
        if annotation is t:
            return t.__name__
    return "str"  # str, Literal[...] of strings, SecretStr


def _help(model: type, name: str, info: Any, env: str | None) -> str:
    doc = info.description or _attribute_docs(model).get(name, "")
    text = re.sub(r"\s+", " ", doc).strip().replace("``", "`")
    if info.default not in (None, "") and not info.is_required() \
            and info.default_factory is None:
        text += f" (default: {info.default})"
    if env is not None:
        text += f" (env {env})"
    if "SecretStr" in str(info.annotation):
        text += _SECRET_NOTE
    return text


def _options(model: type, mapping: dict[str, str], env_prefix: str | None,
             env_names: dict[str, str] | None = None,
             repeatable: frozenset[str] = frozenset()) -> dict[str, Any]:
    out = {}
    sections = _sections(model)
    for flag, path in mapping.items():
        owner, name, info = _field(model, path)
        env = (env_names or {}).get(flag) if env_prefix is None \
            else env_prefix + path.replace(".", "__").upper()
        out[flag] = {"field": path,
                     "type": "list" if flag in repeatable else _type_name(info.annotation),
                     "help": _help(owner, name, info, env),
                     "section": sections.get(path.split(".")[0], ""),
                     "envvar": env if env_prefix is None else None}
    return out


@cache
def generate() -> dict[str, Any]:
    """What the CLI's options are, from the models."""
    from gspo_rl.launch.config import UpConfig
    from gspo_rl.learner.config import LearnerConfig
    from gspo_rl.learner.sft.config import SFTConfig
    from gspo_rl.server.config import ServerSettings

    return {
        "serve": _options(ServerSettings, SERVE, "GSPO_"),
        "serve_after_vllm_arg": _options(ServerSettings, SERVE_AFTER_VLLM_ARG, "GSPO_"),
        "learn": _options(LearnerConfig, LEARN, None, LEARN_ENV),
        "sft": _options(SFTConfig, SFT, None),
        "up": _options(UpConfig, UP, None, UP_ENV, UP_REPEATABLE),
    }


def parameters(section: str) -> list[inspect.Parameter]:
    """The typer parameters of one section of ``generate()`` (a ``list`` field: a repeatable
    option; a field read from the environment: its ``envvar``)."""
    import typer

    spec = generate()[section]
    params = []
    for flag, opt in spec.items():
        kind = {"bool": bool, "int": int, "float": float, "str": str,
                "list": list[str]}[opt["type"]]
        decls = [f"--{flag.replace('_', '-')}/--no-{flag.replace('_', '-')}"] if kind is bool \
            else []
        extra: dict[str, Any] = {"metavar": "<str>..."} if opt["type"] == "list" else {}
        default = typer.Option(None, *decls, help=opt["help"], envvar=opt["envvar"],
                               show_envvar=False, **extra)  # the help says "(env NAME)"
        params.append(inspect.Parameter(flag, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=kind))
    return params


def with_parameters(func: Any, params: list[inspect.Parameter]) -> Any:
    """``func(**params)`` with ``params`` as its signature, which typer reads."""
    func.__signature__ = inspect.Signature(params, return_annotation=None)
    return func


def config_option(help_text: str) -> inspect.Parameter:
    """A command's ``--config`` (a TOML file of its config model's fields)."""
    import typer

    return inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                             default=typer.Option(None, "--config", help=help_text))
