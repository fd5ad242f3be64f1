"""Find the environment a spec names: a built-in example, your own class, or an adapter.

``alphabet`` | ``calculator`` | ``long_letters`` | ``alphabet_dialogue`` |
``path/to/my_env.py:MyEnv`` | ``my_package.my_env:MyEnv`` | ``verifiers:MODULE`` |
``reasoning-gym:NAME[:weight],...`` | ``openenv:URL`` | ``textarena:GAME_ID``
(``gspo_rl.client.adapters``).
A class (or a function returning an environment)
is called with the spec's arguments as keyword arguments (``--env-arg key=value``: the value
parsed as JSON when it is JSON other than ``null``, else kept as a string; dotted keys nest:
``a.b=1`` -> ``{"a": {"b": 1}}``); an instance named the same way is used as it is and takes no
arguments. ``group_size``, when given, is set on the environment afterwards.

Several environments run side by side (``gspo_rl.client.mixture``): each spec may end in
``@WEIGHT`` (its share of the groups, default 1), and an argument is addressed to one of them
by its name (``NAME:key=value``; the name is the class or the adapter's target,
``EnvSpec.name``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from gspo_rl.client.adapters import adapter_prefix, load_adapter
from gspo_rl.client.environment import Environment, MultiTurnEnvironment, SingleTurnEnvironment

BUILTIN = {"alphabet": ("gspo_rl.client.examples.alphabet", "AlphabetEnvironment"),
           "calculator": ("gspo_rl.client.examples.calculator", "CalculatorEnvironment"),
           "long_letters": ("gspo_rl.client.examples.long_letters", "LongLettersEnvironment"),
           "alphabet_dialogue": ("gspo_rl.client.examples.alphabet_dialogue",
                                 "AlphabetDialogueEnvironment")}
SPEC_FORMS = ("alphabet | calculator | long_letters | alphabet_dialogue | "
              "path/to/module.py:EnvClass | "
              "package.module:EnvClass | "
              "verifiers:MODULE | reasoning-gym:NAME[,NAME...] | openenv:URL | "
              "textarena:GAME_ID")


@dataclass
class EnvSpec:
    """One ``--env``: what to load, its share of the groups and its arguments."""

    spec: str
    weight: float = 1.0
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Its name in metrics and in ``NAME:key=value`` arguments: the built-in's name, the
        class after the last ``:``, or the adapter's target: a verifiers taskset's module
        (a path's last part), reasoning-gym's generators joined by ``+``, a URL's host:port, a
        textarena game's id."""
        if self.spec in BUILTIN:
            return self.spec
        prefix = adapter_prefix(self.spec)
        if prefix is None:
            return self.spec.rpartition(":")[2] or self.spec
        rest = self.spec[len(prefix) + 1:]
        if prefix == "verifiers":
            return Path(rest.partition(":{")[0].rstrip("/\\")).stem or rest
        if prefix == "reasoning-gym":
            return "+".join(part.split(":")[0].strip() for part in rest.split(","))
        if prefix == "textarena":
            return rest
        host = rest.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]
        return host or rest  # without a URL's user:password@


def parse_spec(text: str) -> EnvSpec:
    """``SPEC[@WEIGHT]``; ValueError for an empty spec or a weight that is not a finite
    positive number."""
    spec, sep, weight = text.rpartition("@")
    if not sep or "/" in weight or ":" in weight:
        spec, w = text, 1.0
    else:
        try:
            w = float(weight)
        except ValueError:  # an @ that is part of the spec (a URL's user@host)
            spec, w = text, 1.0
    if not spec.strip():
        raise ValueError(f"--env {text!r}: name an environment ({SPEC_FORMS})[@WEIGHT]")
    if not (w > 0 and math.isfinite(w)):
        raise ValueError(f"--env {text}: the weight after @ must be a finite number > 0")
    return EnvSpec(spec, w)


def parse_value(raw: str) -> Any:
    """A ``--env-arg`` value: a JSON number, boolean, object, array or quoted string as
    such; anything else (``null`` included: ``harness=null`` names the null harness; and
    ``NaN`` or ``Infinity``, which JSON does not have) as the string itself."""
    try:
        value = json.loads(raw, parse_constant=_not_json)
    except ValueError:
        return raw
    return raw if value is None else value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def nest(args: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` (dotted: nested dicts) to ``value`` in ``args``."""
    *parents, last = key.split(".")
    if not all([*parents, last]):
        raise ValueError(f"--env-arg {key!r}: a key (each part of a dotted one) must not be "
                         "empty")
    node = args
    for p in parents:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ValueError(f"--env-arg {key}: {p} is already set to a value, not a table")
        node = child
    node[last] = value


def with_args(specs: list[EnvSpec], items: list[str]) -> list[EnvSpec]:
    """``specs`` with the ``--env-arg`` items (``key=value``; ``NAME:key=value`` to address
    one of several environments) set on them; ValueError for a malformed or unaddressed one."""
    names = [s.name for s in specs]
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg {item!r}: expected key=value")
        target, colon, bare = key.rpartition(":")
        if colon and target in names:
            chosen = [s for s in specs if s.name == target]
        elif colon:
            raise ValueError(f"--env-arg {item!r}: no environment is named {target!r} (the "
                             f"names: {', '.join(names)})")
        elif len(specs) == 1:
            chosen, bare = specs, key
        else:
            raise ValueError(f"--env-arg {item!r}: several environments run; address one as "
                             f"NAME:key=value with NAME one of {', '.join(names)}")
        for s in chosen:
            nest(s.args, bare, parse_value(raw))
    return specs


def _module(where: str) -> Any:
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"no such file: {path}")
        name = f"gspo_env_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(where)


def _construct(spec: str, obj: Any, args: dict[str, Any]) -> Environment:
    is_env = isinstance(obj, SingleTurnEnvironment | MultiTurnEnvironment)
    if is_env and args:
        raise ValueError(f"{spec!r} is an instance: it takes no arguments (got "
                         f"{', '.join(sorted(args))}); name its class instead")
    if is_env or not callable(obj):
        return cast(Environment, obj)
    try:
        return cast(Environment, obj(**args))
    except TypeError as exc:
        raise ValueError(f"{spec!r} does not take these arguments: {exc}") from exc


def load_environment(spec: str, group_size: int | None = None,
                     args: dict[str, Any] | None = None) -> Environment:
    """The environment named by ``spec`` (see the module docstring), built with ``args``.
    ValueError if it is not one: unknown name, missing file or attribute, an adapter that
    cannot run it, or not an environment."""
    args = dict(args or {})
    if adapter_prefix(spec) is not None:
        env = load_adapter(spec, args)
    else:
        if spec in BUILTIN:
            module_name, attr = BUILTIN[spec]
        elif ":" in spec:
            module_name, _, attr = spec.rpartition(":")
        else:
            raise ValueError(f"unknown environment {spec!r}: {SPEC_FORMS}")
        try:
            obj = getattr(_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot load {spec!r}: {exc}") from exc
        env = _construct(spec, obj, args)
    if not isinstance(env, SingleTurnEnvironment | MultiTurnEnvironment):
        raise ValueError(f"{spec!r} is not a SingleTurnEnvironment or MultiTurnEnvironment "
                         f"(got {type(env).__name__})")
    if group_size is not None:
        env.group_size = group_size
    return env
