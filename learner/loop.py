"""The learner process: read groups, train, checkpoint, acknowledge, push weights, log.

Components, wired here: ``GroupReader`` (``gspo_rl.redisq.ready.reader``), ``Trainer``
(``gspo_rl.learner.trainer``) on a ``Policy``, ``save_checkpoint`` / ``load_latest``
(``gspo_rl.learner.checkpoint.store``), ``WeightSync`` (``gspo_rl.learner.weights.base``) and
``MetricsLogger`` (``gspo_rl.learner.tracking.metrics``).

One iteration: ``read_batch`` -> ``trainer.step`` -> version += 1 -> every ``sync_every``
steps push the weights -> every ``save_every`` steps checkpoint, *then* ack the groups trained
since the previous checkpoint -> publish version, step and the admission parameters to
``Keys.learner_state`` (``gspo_rl.learner.runtime.published``) -> log; then log the evaluation
results posted since (``gspo_rl.redisq.evals``).

Contract: a group is acknowledged only after a durable checkpoint contains its update (without
``save_dir``: right after its step, at-most-once on a crash); on resume the checkpoint's ids
are acked and every still-pending entry is redelivered. Policy versions stay monotonic across
restarts, and the version is published before each push. Healing, Redis retries, signals and
the target-reward stop: docs/design/learner-loop.md.
"""

from __future__ import annotations

import gc
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from gspo_rl.contract.admission import FIELD_TRAINING, capacity
from gspo_rl.contract.gc_freeze import freeze_startup_objects
from gspo_rl.contract.schema import Keys
from gspo_rl.learner.checkpoint.store import Checkpoint, LearnerState
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.data.batching import AdvantageFn, split_invalid
from gspo_rl.learner.effects import LoopEffects
from gspo_rl.learner.parallel.distributed import DistContext
from gspo_rl.learner.parallel.protocol import Idle, Resume, Stop, Train, send
from gspo_rl.learner.runtime.final_eval import await_final_eval
from gspo_rl.learner.runtime.healing import ServerHealer
from gspo_rl.learner.runtime.progress import (
    ProgressMonitor,
    RedisRetry,
    RedisUnavailable,
    no_groups_detail,
)
from gspo_rl.learner.runtime.published import (
    Heartbeat,
    TrainedRewards,
    publish_state,
    publish_token_ratios,
    publish_training,
    ratios_ttl_s,
)
from gspo_rl.learner.runtime.target import (
    TargetStop,
    continue_hint,
    drain,
    groups_in_flight,
    read_in_flight,
)
from gspo_rl.learner.startup import (
    build_weight_sync,
    checkpoint_to_resume,
    open_tracking,
)
from gspo_rl.learner.tracking.base import check_installed
from gspo_rl.learner.tracking.metrics import (
    MetricsLogger,
    fates_line,
    group_fates,
    log_new_evals,
)
from gspo_rl.learner.tracking.samples import SampleLogger
from gspo_rl.learner.weights.base import NoSync, WeightSync
from gspo_rl.redisq.ready.lineage import Lineage
from gspo_rl.redisq.ready.reader import Batch, GroupReader

log = logging.getLogger(__name__)
T = TypeVar("T")
_REDIS_SOCKET_TIMEOUT_S = 30.0
_HEAL_INTERVAL_S = 5.0  # > the servers' heartbeat interval (2 s): versions have settled


class Learner(LoopEffects):
    """Owns every component of the learner process; ``run`` is the main loop (its start-up
    and side effects: ``LoopEffects``)."""

    def __init__(
        self,
        config: LearnerConfig,
        *,
        client: redis.Redis | None = None,
        sync: WeightSync | None = None,
        advantage_fn: AdvantageFn | None = None,
        dist: DistContext | None = None,
    ) -> None:
        check_installed(config.report_to)  # before any model load: a missing extra, at once
        self.config = config
        self.dist = dist
        self.run_id = uuid.uuid4().hex[:12]
        # Bounded socket waits: a paused Redis is an error to retry, not a hang (reads block
        # in slices of at most 1 s, see gspo_rl.redisq.ready.reader).
        self.client = client or redis.Redis.from_url(
            config.redis_url, socket_timeout=_REDIS_SOCKET_TIMEOUT_S,
            socket_connect_timeout=_REDIS_SOCKET_TIMEOUT_S)
        self.keys = Keys(config.key_prefix)
        self.sync = sync if sync is not None else build_weight_sync(config, self.client)
        ckpt = checkpoint_to_resume(config)
        if dist is not None:  # the other ranks load the same weights and optimiser state
            send(dist, Resume(str(ckpt.path) if ckpt is not None else None))
        self._load_model(ckpt.path if ckpt is not None else Path(config.model), advantage_fn)
        self.step, self.version, self.groups_trained = 0, 0, 0
        self.tokens_trained = 0  # sampled tokens trained on, since the run began
        self.trained_rewards = TrainedRewards()  # published with the state: the dashboard's
        self.heartbeat = Heartbeat(self.client, self.keys)  # started by run()
        self.pending_ack: list[str] = []
        self._partial_said: float | None = None  # when _say_partial last spoke
        # Acked after a checkpoint; acked again after a Redis outage (AOF may lose ~1 s).
        self.recent_acked: deque[str] = deque(maxlen=10_000)
        self._stop = False
        self.target = TargetStop(config.target_reward, config.target_window)
        self.lineage = Lineage()  # resumes: how far redelivered groups really are
        self._saved_at = time.monotonic()  # save_every_s counts from here
        if ckpt is not None:
            self._restore(ckpt)
        self.resumed_from = self.step
        self._init_reporting()
        self._join_queue(ckpt)

    def _init_reporting(self) -> None:
        """Metrics and trackers, stall reports, samples, Redis retries and server healing."""
        config = self.config
        self.metrics = MetricsLogger(config.metrics_path, config.console,
                                     open_tracking(config, self.run_id, self.step), self.step)
        self.progress = ProgressMonitor(  # stalls also in the state hash: the dashboard's
            self.metrics, run_id=self.run_id,
            publish=lambda fields: publish_state(self.client, self.keys, fields))
        self.samples = SampleLogger(config.samples_every, self.tokenizer_src)
        self.retry = RedisRetry(config.redis_retry_s)
        self._pushed_version = -1
        if hasattr(self.sync, "on_stall"):  # a push's long waits: stall records, WARNINGs
            self.sync.on_stall = lambda detail: self.progress.stalled(
                "weight_push", detail, every_s=0.0)  # paced by the push
        key = config.admin_key.get_secret_value() if config.admin_key else None
        self.healer = None if isinstance(self.sync, NoSync) else ServerHealer(
            self.client, self.keys, key, self.progress, _HEAL_INTERVAL_S)

    def _join_queue(self, ckpt: Checkpoint | None) -> None:
        """The ready queue read as this run's consumer (the checkpoint's groups acked again),
        the servers brought to the run's weights, and the start recorded."""
        config = self.config
        self.reader = self._retrying(lambda: GroupReader(
            self.client, self.keys, config.consumer, config.max_staleness,
            keep_trained_s=config.keep_trained_s))
        self.reader.lineage = self.lineage
        if ckpt is not None:  # idempotent: the crash may follow the ack
            self._retrying(lambda: self.reader.ack(ckpt.state.entry_ids))
        self.target.observe(self.client, self.keys)  # the reward window's baseline
        self._retrying(self._resync)
        self.metrics.event({"event": "start", "run_id": self.run_id, "time": time.time(),
                            "resumed_from": self.resumed_from, "version": self.version,
                            "checkpoint": str(ckpt.path) if ckpt else None,
                            **self._param_counts()})

    def _retrying(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried while Redis does not answer (``RedisUnavailable`` after
        ``redis_retry_s``)."""
        while True:
            try:
                out = fn()
            except redis.RedisError as exc:
                self.progress.stalled("redis_down", str(exc))
                self.retry.failed(exc)
                continue
            if self.retry.ok():
                self.progress.clear("redis_down")
            return out

    # ---------------------------------------------------------------- the loop

    def request_stop(self) -> None:
        """Stop after the current step (``gspo_rl.learner.run.graceful_signals`` calls it)."""
        self._stop = True

    @property
    def stop_requested(self) -> bool:
        return self._stop

    def done(self) -> bool:
        finished = bool(self.target.finished)  # the target reward was reached
        return self._stop or finished or self._at_cap()

    def _at_cap(self) -> bool:
        cap = self.config.max_steps
        return cap is not None and self.step >= cap

    def run(self) -> LearnerState:
        """Train until ``max_steps`` or a stop request; returns the final state."""
        log.info("start-up objects frozen out of the garbage collector: %d",
                 freeze_startup_objects())
        if (why := self.config.clip_inactive) is not None:
            log.info("the %s clip will not act: %s", self.config.loss.kind, why)
        self.heartbeat.start()
        try:
            while not self.done():
                self._iterate()
                if self.target.met:
                    self._finish_at_target()
            self._checkpoint(force=True)
            try:  # evaluations posted during the last step
                log_new_evals(self.client, self.keys, self.metrics, self.run_id, self.step)
            except redis.RedisError as exc:
                log.warning("evaluation results not logged (still in Redis): %s", exc)
            if self.target.finished:
                log.warning("stopped at step %d: %s. %s; %s", self.step, self.target.finished,
                            fates_line(self._retrying(lambda: group_fates(
                                self.client, self.keys))), continue_hint())
            if self.dist is not None:
                send(self.dist, Stop())
            await_final_eval(self.client, self.keys, self.metrics, self.run_id, self.step,
                             self._pushed_version, self.config.final_eval_wait_s,
                             lambda: self._stop)
        finally:
            gc.unfreeze()  # collectable again (tests run several learners in one process)
            self.heartbeat.stop()
            self.sync.close()
            self.metrics.event({"event": "stop", "run_id": self.run_id, "step": self.step,
                                "version": self.version, "time": time.time()})
            self.metrics.close()
        return LearnerState(self.step, self.version, list(self.pending_ack),
                            self.groups_trained)

    def _iterate(self) -> None:
        """One pass of the loop: heal the servers, train a step; Redis errors are retried
        (bounded); giving up saves what was trained first."""
        try:
            self._heal()
            self.run_step()
            log_new_evals(self.client, self.keys, self.metrics, self.run_id, self.step)
        except redis.RedisError as exc:
            self.progress.stalled("redis_down", str(exc))
            try:
                self.retry.failed(exc)
            except RedisUnavailable:
                log.error("giving up: %s", exc)
                self._checkpoint(force=True)  # the ack fails; --resume acks it
                raise
            return
        if self.retry.ok():
            self.progress.clear("redis_down")
            self._retrying(self._recover_reader)

    def _finish_at_target(self) -> None:
        """The target is met: publish ``finished`` (servers start no new group), then train
        the groups still in flight (``gspo_rl.learner.runtime.target.drain``)."""
        log.warning("%s", self.target.finish(self.step))
        self._publish_state()
        if not drain(lambda: self._retrying(lambda: groups_in_flight(self.client, self.keys)),
                     self._iterate, lambda: self._stop or self._at_cap(),
                     self.config.drain_timeout_s):
            log.warning("groups were still in flight when the learner stopped "
                        "(drain_timeout_s, max_steps or a signal): not trained")

    def _recover_reader(self) -> None:
        """After an outage: re-ack what Redis may have forgotten, and claim again what a
        failed read left pending (not what awaits its checkpoint)."""
        self.reader.ack(list(self.recent_acked))
        self.reader.rearm(held=self.pending_ack, committed=self.recent_acked)

    def _heal(self) -> None:
        """Push to restarted servers (``gspo_rl.learner.runtime.healing``); raises on Redis
        errors."""
        if self.healer is not None:
            self.healer.check(self._pushed_version, self.version, self._push_ok)

    def run_step(self) -> dict[str, Any] | None:
        """Read one batch and train on it; returns the step record (None: nothing trained)."""
        t0 = time.perf_counter()
        batch = self.reader.read_batch(
            self.config.groups_per_step, self.version, self.config.read_timeout_s,
            count_to=(self.keys.learner_state, FIELD_TRAINING))
        wait_s = time.perf_counter() - t0
        invalid = self._screen(batch)
        # A batch already read is the current step: a stop request arriving during the read
        # still trains it, so the exit checkpoint acks it instead of leaving it pending.
        train = bool(batch.groups)
        if self.dist is not None:  # every read, so no rank waits longer than one read
            send(self.dist, Train(batch.groups) if train else Idle())
        if not train:
            publish_training(self.client, self.keys, 0)  # what was delivered left: dropped
            if batch.dropped_stale:
                self.reader.trim()  # acked, but trimmed only by an ack: the stream looked full
                self.progress.stalled("all_stale", f"{batch.dropped_stale} groups older than "
                                      f"{self.config.max_staleness} versions (learner at "
                                      f"{self.version}) dropped, none to train")
            else:
                self.progress.stalled("no_groups", self._no_groups_detail)
            return None
        publish_training(self.client, self.keys, len(batch.groups))  # still in flight
        self._say_partial(len(batch.groups))
        metrics = self.trainer.step(batch.groups)
        publish_token_ratios(self.client, self.keys, self.trainer.log_ratios,
                             ratios_ttl_s(self.config))
        self.step += 1
        self.version += 1
        self.groups_trained += len(batch.groups)
        self.trained_rewards.add(batch.groups)
        self.tokens_trained += int(metrics.get("trained_tokens", 0))
        self.pending_ack.extend(batch.entry_ids)
        self._last_sync_bytes = 0
        sync_s = self._push() if self.step % self.config.sync_every == 0 else 0.0
        rec = self._record(batch, metrics, invalid,
                           {"time_wait_s": wait_s, "time_sync_s": sync_s,
                            "sync_bytes": self._last_sync_bytes,
                            "env_reward": self.target.observe(self.client, self.keys)})
        # Logged before the checkpoint that may cover it: a crash right after the save must
        # not leave a durable step missing from the audit log (``trained_history``).
        self.metrics.log(rec)
        self.samples.log(self.metrics.tracker, self.step, batch)
        self._checkpoint(force=False)
        self._publish_state()
        return rec

    def _say_partial(self, n: int) -> None:
        """A batch short of ``groups_per_step`` (the read timed out) is trained as it is; say
        so, at most once a minute, with the knob that changes it."""
        want = self.config.groups_per_step
        if n >= want or (self._partial_said is not None
                         and time.monotonic() - self._partial_said < 60.0):
            return
        self._partial_said = time.monotonic()
        log.info("step %d trains %d of %d groups: no more arrived within read_timeout_s "
                 "(%g s; the environment finishes fewer than %d groups in that time). Raise "
                 "--read-timeout-s to train full batches", self.step + 1, n, want,
                 self.config.read_timeout_s, want)

    def _no_groups_detail(self) -> str:
        """Why no group arrives (``gspo_rl.learner.runtime.progress.no_groups_detail``)."""
        try:
            facts = read_in_flight(self.client, self.keys)
        except redis.RedisError as exc:
            return f"the ready stream is empty (the groups in flight could not be read: {exc})"
        return no_groups_detail(facts, capacity(self.config.max_staleness,
                                                self.config.groups_per_step))

    def _screen(self, batch: Batch) -> int:
        """Drop (ack and count) groups that can never be trained (``split_invalid``)."""
        bad = split_invalid(batch, self.trainer.advantage_fn)
        if bad:
            self.reader.drop_invalid(bad)
        return len(bad)
