"""A scoring pool for a single-turn environment: ``ScoringPool.for_environment``.

``pool_for_environment(pool_cls, env)`` builds the pool that runs ``env.scorer()`` (by default
``env.score``, which pickles the whole environment) in ``env.score_workers`` processes, each
call limited to ``env.score_timeout_s``; modules loaded from files (``gspo_env_*``,
``gspo_verifier_*``: ``gspo_rl.client.loading``) that it refers to are preloaded by file
(``pickling``). A scorer that does not pickle: ``TypeError`` naming the environment and what
to change. ``HasScorer``: the environment as seen here (no import of the environment module).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

Pool = TypeVar("Pool")


class HasScorer(Protocol):
    """A single-turn environment, as ``ScoringPool.for_environment`` sees it."""

    score_workers: int
    score_timeout_s: float

    def scorer(self) -> Callable[..., Any]: ...


def _same(value: Any) -> Any:
    return value


def pool_for_environment(pool_cls: Callable[..., Pool], env: HasScorer, *,
                         workers: int | None, timeout_s: float | None) -> Pool:
    """The pool (``pool_cls``, a ``ScoringPool``) that runs ``env.scorer()``; ``workers`` and
    ``timeout_s`` (None: the environment's) as ``ScoringPool.for_environment``."""
    workers = env.score_workers if workers is None else workers
    timeout_s = env.score_timeout_s if timeout_s is None else timeout_s
    name = type(env).__name__
    try:
        return pool_cls(functools.partial(_same, env.scorer()), workers=workers,
                        timeout_s=timeout_s, name=name)
    except TypeError as exc:
        raise TypeError(
            f"{name} cannot score in worker processes (score_workers={workers}): {exc}. "
            "What scores must pickle: keep clients, locks, open files and lambdas off the "
            "environment (make them lazily), override scorer() to send less, or set "
            "score_workers = 0") from exc
