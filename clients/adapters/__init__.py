"""Environments from other ecosystems, run unmodified: ``verifiers:``, ``reasoning-gym:``,
``openenv:`` and ``textarena:`` specs (``gspo env``, ``gspo up --env``, the Python API).

An adapter is a module of this package with ``load(target: str, args: dict[str, Any]) ->
Environment``: ``target`` is what follows the spec's prefix (``verifiers:toy_math`` ->
``toy_math``), ``args`` the ``--env-arg`` settings (JSON values, dotted keys nested). Its
library is imported only when the adapter is used; when it is missing, ``load`` raises
``AdapterUnavailable`` naming the extra that installs it. Anything an adapter cannot run is
refused in ``load`` (a ``ValueError`` that says what is supported), before any group starts.
"""

from __future__ import annotations

import importlib
from typing import Any

ADAPTERS: dict[str, tuple[str, str]] = {
    "verifiers": ("gspo_rl.client.adapters.verifiers", "verifiers"),
    "reasoning-gym": ("gspo_rl.client.adapters.reasoning_gym", "reasoning-gym"),
    "openenv": ("gspo_rl.client.adapters.openenv", "openenv"),
    "textarena": ("gspo_rl.client.adapters.textarena", "textarena"),
}
"""Spec prefix -> (adapter module, the gspo-rl extra that installs its library)."""


class AdapterUnavailable(ValueError):
    """The adapter's library is not installed (the message names the extra)."""


def missing(prefix: str, exc: ImportError) -> AdapterUnavailable:
    """The error for an adapter whose library failed to import."""
    extra = ADAPTERS[prefix][1]
    return AdapterUnavailable(
        f"{prefix}: environments need the {extra!r} extra ({exc}): pip install "
        f"'gspo-rl[{extra}]' (from a checkout: GSPO_EXTRAS=dev,{extra} bash scripts/setup.sh)")


def adapter_prefix(spec: str) -> str | None:
    """The adapter prefix ``spec`` starts with (``verifiers:...`` -> ``verifiers``), or None."""
    head, sep, _ = spec.partition(":")
    return head if sep and head in ADAPTERS else None


def load_adapter(spec: str, args: dict[str, Any]) -> Any:
    """The environment an adapter spec names (``PREFIX:TARGET``)."""
    prefix = adapter_prefix(spec)
    if prefix is None:
        raise ValueError(f"not an adapter spec: {spec!r} (prefixes: {', '.join(ADAPTERS)})")
    target = spec[len(prefix) + 1:]
    if not target:
        raise ValueError(f"{spec!r}: name what to load after {prefix}:")
    module = importlib.import_module(ADAPTERS[prefix][0])
    return module.load(target, args)
