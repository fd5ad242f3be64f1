"""Lua scripts with named keys and arguments.

A script declares the names of its ``KEYS`` and ``ARGV`` slots; its source starts with a
prologue that binds each slot to a Lua local of that name, so the body reads ``group_key``,
not ``KEYS[1]``, and a caller passes a mapping, not a list whose order is agreed in a comment:
``script.slots(keys={...}, args={...})`` gives the lists in the declared order and refuses a
missing or unknown name. A trailing variable part (ids, pairs) is ``rest``: the body finds it
from ``ARGV[<rest>_at]`` on. A name ending in ``?`` is optional: it and every later slot may
be left out (its local is then ``nil``). Arguments that never change for one store (key
templates, settings) can be encoded once (``constants``) and passed in their place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gspo_rl.redisq.connection import encode_args


@dataclass(frozen=True)
class Constants:
    """A run of consecutive arguments, encoded once (``LuaScript.constants``)."""

    names: tuple[str, ...]
    encoded: Any


@dataclass(frozen=True)
class LuaScript:
    """A Lua script's named ``KEYS`` and ``ARGV``, its helpers and its body."""

    keys: tuple[str, ...]
    args: tuple[str, ...]
    body: str
    rest: str | None = None
    helpers: str = ""
    source: str = field(init=False)

    def __post_init__(self) -> None:
        for names in (self.keys, self.args):
            seen_optional = False
            for n in names:
                seen_optional = seen_optional or n.endswith("?")
                if seen_optional and not n.endswith("?"):
                    raise ValueError(f"{n}: a required slot after an optional one")
        object.__setattr__(self, "source", self.helpers + self._prologue() + self.body)

    def _prologue(self) -> str:
        lines = [f"local {_bare(n)} = KEYS[{i}]" for i, n in enumerate(self.keys, 1)]
        lines += [f"local {_bare(n)} = ARGV[{i}]" for i, n in enumerate(self.args, 1)]
        if self.rest is not None:
            lines.append(f"local {self.rest}_at = {len(self.args) + 1}")
        return "\n".join(lines) + "\n"

    def constants(self, **values: Any) -> Constants:
        """Encodes ``values`` once: they must name a run of consecutive arguments."""
        names = tuple(values)
        plain = tuple(_bare(n) for n in self.args)
        start = plain.index(names[0]) if names and names[0] in plain else -1
        if start < 0 or plain[start:start + len(names)] != names:
            raise ValueError(f"not a run of consecutive arguments of this script: {names}")
        return Constants(names, encode_args(*values.values()))

    def slots(self, keys: Mapping[str, Any], args: Mapping[str, Any] | None = None,
              rest: Sequence[Any] = (), constants: Constants | None = None,
              ) -> tuple[list[Any], list[Any]]:
        """``KEYS`` and ``ARGV`` in the declared order."""
        args = args or {}
        out_keys = _ordered(self.keys, keys, "key")
        given = dict(args)
        covered = set(constants.names) if constants is not None else set()
        if covered & set(given):
            raise ValueError(f"passed both encoded and as arguments: {covered & set(given)}")
        out_args: list[Any] = []
        names = [_bare(n) for n in self.args]
        i = 0
        while i < len(names):
            if constants is not None and names[i] == constants.names[0]:
                out_args.append(constants.encoded)
                i += len(constants.names)
                continue
            if names[i] not in given:
                if self.args[i].endswith("?") and not (set(names[i:]) & set(given)):
                    break
                raise ValueError(f"missing argument {names[i]!r}")
            out_args.append(given.pop(names[i]))
            i += 1
        if given:
            raise ValueError(f"unknown arguments {sorted(given)}")
        if rest and self.rest is None:
            raise ValueError("this script takes no variable part")
        if rest and len(out_args) < len(self.args) and constants is None:
            raise ValueError("a variable part needs every argument before it")
        return out_keys, [*out_args, *rest]


def template_args(letter: str, template: Sequence[str]) -> dict[str, str]:
    """A key template (``schema.key_template``: the text before and after an id) as a
    script's ``<letter>_head`` and ``<letter>_tail`` arguments."""
    head, tail = template
    return {f"{letter}_head": head, f"{letter}_tail": tail}


def _bare(name: str) -> str:
    return name.rstrip("?")


def _ordered(declared: tuple[str, ...], given: Mapping[str, Any], what: str) -> list[Any]:
    out = []
    for n in declared:
        b = _bare(n)
        if b in given:
            out.append(given[b])
        elif n.endswith("?"):
            break
        else:
            raise ValueError(f"missing {what} {b!r}")
    if len(out) != len(given):
        raise ValueError(f"unknown {what}s {sorted(set(given) - {_bare(n) for n in declared})}")
    return out
