"""Scoring off the event loop: worker processes that run a scoring function, with a time limit.

``ScoringPool(make_scorer, workers=N, timeout_s=T, preload=...)`` runs ``scorer(*args)`` in
one of at most ``N`` worker processes (``spawn``: safe beside threads and asyncio), in the
worker's main thread, where signal-based time limits (math-verify's) work. ``make_scorer``: a
picklable zero-argument callable run once per worker to build ``scorer``; ``preload``: modules
(names or ``.py`` files) each worker imports first. ``await pool.score(*args)``:

- returns what the scorer returned (it must pickle);
- past ``timeout_s``: kills the worker (SIGKILL), starts a replacement, raises
  ``ScoringTimeout``; a worker that dies: ``ScoringCrashed``, and a replacement;
- the scorer raised: ``ScoringError`` with its type, message and traceback text.

``score_many(calls)``: all at once; the first failure raises, calls not yet started never do.

Workers start lazily (a call that finds none free starts one while fewer than ``N`` run, else
waits; a long wait is logged). A call cancelled mid-score kills its worker (the late answer
would reach the next call). ``close()`` (idempotent; ``async with``) stops them all; a pool
pickles and copies as None. Workers are daemons: a scorer may run subprocesses, not
``multiprocessing`` children; a script must start its run under ``if __name__ == "__main__"``.

``ScoringPool.for_environment(env)`` runs ``env.scorer()`` (by default ``env.score``: the whole
environment pickled); modules loaded from files that it refers to are preloaded by file.
Modules: ``pool``, ``process`` (the parent's end of a worker), ``worker`` (what runs in it),
``pickling``, ``environment``, ``errors``. Guide: docs/environments/scoring.md.
"""

from gspo_rl.client.scoring.environment import HasScorer
from gspo_rl.client.scoring.errors import ScoringCrashed, ScoringError, ScoringTimeout
from gspo_rl.client.scoring.pickling import FILE_MODULE_PREFIXES, PICKLE_ERRORS, pickled
from gspo_rl.client.scoring.pool import START_TIMEOUT_S, WAIT_LOG_S, ScoringPool
from gspo_rl.client.scoring.worker import Preload

__all__ = [
    "FILE_MODULE_PREFIXES", "PICKLE_ERRORS", "START_TIMEOUT_S", "WAIT_LOG_S", "HasScorer",
    "Preload", "ScoringCrashed", "ScoringError", "ScoringPool", "ScoringTimeout", "pickled",
]
