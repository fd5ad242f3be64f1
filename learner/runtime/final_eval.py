"""The evaluation of the final weights, logged by the learner that trained them.

Evaluations run on the environment's side and reach the learner through Redis
(``gspo_rl.redisq.evals``); it logs them after each step, to its metrics JSONL and its
trackers. One that is posted after the last step would reach no tracker once the learner has
exited. With ``final_eval_wait_s`` (``gspo up`` sets it when it evaluates), the learner, having
trained and checkpointed, writes a ``{"event": "final_eval_wait", "version": V}`` record (``gspo
up`` reads it as "evaluate now"), then keeps logging the posted results until every eval set
that has posted one (at least one set) has a result at version V or later (the weights the
servers hold), for at most ``final_eval_wait_s`` seconds, or until it is asked to stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

import redis

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.tracking.metrics import MetricsLogger, log_new_evals
from gspo_rl.redisq.evals import decode_entries

log = logging.getLogger("gspo_rl.learner.loop")
WAIT_EVENT = "final_eval_wait"
POLL_S = 0.5
SAY_EVERY_S = 30.0


def newest_versions(client: redis.Redis, keys: Keys, seen: dict[str, int],
                    after: str = "0-0") -> str:
    """Adds to ``seen`` (eval set -> newest policy version evaluated) the results posted after
    stream id ``after``; returns the id of the last one read."""
    while True:
        # redis-py types an entry's fields as optional: XRANGE's never are (nor str: bytes
        # replies, decode_responses=False)
        raw = cast("list[tuple[bytes, dict[bytes, bytes]]]",
                   client.xrange(keys.eval_stream, min=f"({after}", count=500))
        if not raw:
            return after
        for entry_id, result in decode_entries(raw):
            name = str(result.get("name", "eval"))
            seen[name] = max(seen.get(name, -1), int(result.get("policy_version", -1)))
            after = entry_id


def await_final_eval(client: redis.Redis, keys: Keys, logger: MetricsLogger, run_id: str,
                     step: int, version: int, wait_s: float,
                     stopped: Callable[[], bool]) -> bool:
    """Waits for the evaluation of ``version`` and logs it (module docstring); True once every
    eval set has a result at ``version`` or later. Nothing when ``wait_s`` is 0 or a stop was
    asked."""
    if wait_s <= 0 or stopped():
        return False
    logger.event({"event": WAIT_EVENT, "run_id": run_id, "step": step, "version": version,
                  "wait_s": wait_s, "time": time.time()})
    log.info("waiting up to %g s for the evaluation of version %d (final_eval_wait_s)", wait_s,
             version)
    deadline, seen, after = time.monotonic() + wait_s, dict[str, int](), "0-0"
    said = time.monotonic()
    while True:
        try:  # read, then log: every result read is logged before the wait ends
            after = newest_versions(client, keys, seen, after)
            log_new_evals(client, keys, logger, run_id, step)
        except redis.RedisError as exc:
            log.warning("evaluation results not read (retrying): %s", exc)
        if seen and all(v >= version for v in seen.values()):
            log.info("final evaluation of version %d logged", version)
            return True
        stop = stopped()
        if stop or time.monotonic() >= deadline:
            log.warning("no evaluation of version %d %s; not logged by this learner (a "
                        "result posted later stays in Redis for the next one)", version,
                        "before the stop" if stop else f"within {wait_s:g} s")
            return False
        if time.monotonic() - said >= SAY_EVERY_S:  # a wait that lasts says so
            said = time.monotonic()
            log.info("still waiting for the evaluation of version %d (%.0f s left; newest "
                     "evaluated: %s)", version, deadline - said, seen or "none yet")
        time.sleep(POLL_S)
