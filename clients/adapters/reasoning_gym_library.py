"""reasoning-gym itself, as the adapter (``gspo_rl.client.adapters.reasoning_gym``) uses it:
the library imported on first use (``AdapterUnavailable`` without it), a spec's generators and
their settings checked against its registry (a ``ValueError`` naming what exists, with the
closest name), its datasets made, and a completion scored as its eval scripts score one
(``score_entry``: picklable, for worker processes; the scorers cached per process).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from collections.abc import Mapping
from typing import Any

from gspo_rl.client.adapters import missing

PREFIX = "reasoning-gym"
OWN_FIELDS = ("seed", "size")
"""Config fields the adapter sets itself (the ``seed`` and ``size`` arguments)."""
UNSUPPORTED = {"composite": "mix generators with the spec's comma list instead "
                            "(reasoning-gym:NAME:WEIGHT,NAME:WEIGHT)"}


def library() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise missing(PREFIX, exc) from exc
    return reasoning_gym


def registry() -> dict[str, tuple[type, type]]:
    """Generator name -> (dataset class, config dataclass), as the library registers them."""
    library()
    from reasoning_gym.factory import DATASETS

    datasets: dict[str, tuple[type, type]] = DATASETS  # (reasoning-gym ships no types)
    return datasets


def suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_target(target: str) -> list[tuple[str, float]]:
    """``NAME[:WEIGHT][,NAME[:WEIGHT]...]`` -> [(name, weight)]; ValueError when malformed."""
    out: list[tuple[str, float]] = []
    for part in (p.strip() for p in target.split(",")):
        name, sep, weight = part.partition(":")
        if not name:
            raise ValueError(f"{PREFIX}:{target}: an empty generator name")
        try:
            w = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"{PREFIX}:{target}: the weight of {name!r} must be a number, "
                             f"got {weight!r}") from None
        if not w > 0:
            raise ValueError(f"{PREFIX}:{target}: the weight of {name!r} must be > 0")
        if name in (n for n, _ in out):
            raise ValueError(f"{PREFIX}:{target}: {name!r} is named twice")
        out.append((name, w))
    return out


def check_name(name: str) -> None:
    """ValueError unless ``name`` is a generator this adapter can run."""
    known_generators = registry()
    if name in UNSUPPORTED:
        raise ValueError(f"{PREFIX}: {name!r} is not supported: {UNSUPPORTED[name]}")
    if name not in known_generators:
        known = sorted(set(known_generators) - set(UNSUPPORTED))
        raise ValueError(f"{PREFIX}: no generator {name!r}{suggest(name, known)}; the "
                         f"{len(known)} generators of reasoning-gym: {', '.join(known)}")


def check_config(name: str, config: Any) -> None:
    """ValueError unless ``config`` holds settings of ``name``'s config dataclass."""
    if not isinstance(config, Mapping):
        raise ValueError(f"{PREFIX}: the settings of {name!r} must be a mapping "
                         f"({name}.KEY=VALUE), got {config!r}")
    fields = [f.name for f in dataclasses.fields(registry()[name][1])]
    settable = [f for f in fields if f not in OWN_FIELDS]
    for key in config:
        if key in OWN_FIELDS:
            raise ValueError(f"{PREFIX}: {name}.{key} is set by the adapter: use the "
                             f"{key!r} argument (--env-arg {key}=...)")
        if key not in fields:
            raise ValueError(f"{PREFIX}: {name} has no setting {key!r}"
                             f"{suggest(key, settable)}; its settings: {', '.join(settable)}")


def make_dataset(name: str, config: Mapping[str, Any], seed: int, size: int) -> Any:
    """The generator's dataset; ValueError when the library refuses the settings."""
    reasoning_gym = library()
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **config)
    except (AssertionError, TypeError, ValueError) as exc:
        raise ValueError(f"{PREFIX}: {name} refuses the settings {dict(config)}: "
                         f"{exc or type(exc).__name__}") from None


@functools.lru_cache(maxsize=128)
def scorer(name: str, config_json: str) -> Any:
    """One dataset per generator and config, per process: its ``score_answer`` scores."""
    return make_dataset(name, json.loads(config_json), seed=0, size=1)


def score_entry(name: str, config: dict[str, Any], completion: str,
                entry: dict[str, Any]) -> float:
    """The reward of ``completion`` for ``entry`` of generator ``name`` (module docstring).
    Picklable and free of state but a per-process cache: call it in worker processes."""
    dataset = scorer(name, json.dumps(config, sort_keys=True))
    from reasoning_gym.utils import extract_answer

    answer = extract_answer(completion)
    try:
        return float(dataset.score_answer(answer, entry))
    except Exception as exc:  # noqa: BLE001 - a malformed answer, unless the task is broken
        try:
            dataset.score_answer(entry.get("answer"), entry)
        except Exception as broken:
            raise ValueError(f"{PREFIX}: {name} cannot score its own answer of this task "
                             f"({broken!r}): a broken entry") from exc
        return 0.0
