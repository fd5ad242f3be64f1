"""The learner loop's start-up and side effects: loading the policy, restoring a checkpoint,
publishing the state, pushing weights, checkpointing then acknowledging, and the step record.

``LoopEffects`` is a base of ``Learner`` (``gspo_rl.learner.loop``), split off so that the loop
reads as the loop; it holds no state of its own: every attribute named below is the loop's,
set in ``Learner.__init__``. The contract (ack only after a durable checkpoint, versions
published before each push) is the loop's: docs/design/learner-loop.md.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import redis
import torch

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.checkpoint.store import Checkpoint, LearnerState, restore_rng, save_checkpoint
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.data.batching import AdvantageFn
from gspo_rl.learner.model.lora import count_params
from gspo_rl.learner.parallel.distributed import DistContext
from gspo_rl.learner.parallel.loading import export_full, load_policy
from gspo_rl.learner.parallel.protocol import Gather, send
from gspo_rl.learner.runtime.healing import ServerHealer
from gspo_rl.learner.runtime.progress import ProgressMonitor
from gspo_rl.learner.runtime.published import TrainedRewards, publish_state, state_fields
from gspo_rl.learner.runtime.target import TargetStop
from gspo_rl.learner.startup import seed_everything
from gspo_rl.learner.tracking.metrics import MetricsLogger, read_counters, step_fields
from gspo_rl.learner.trainer import Trainer
from gspo_rl.learner.weights.base import WeightSync
from gspo_rl.redisq.ready.lineage import Lineage
from gspo_rl.redisq.ready.reader import Batch, GroupReader

log = logging.getLogger("gspo_rl.learner.loop")


class LoopEffects:
    """Start-up and side effects of ``Learner`` (module docstring)."""

    config: LearnerConfig
    client: redis.Redis
    keys: Keys
    dist: DistContext | None
    sync: WeightSync
    run_id: str
    step: int
    version: int
    groups_trained: int
    tokens_trained: int
    trained_rewards: TrainedRewards
    pending_ack: list[str]
    recent_acked: deque[str]
    lineage: Lineage
    target: TargetStop
    metrics: MetricsLogger
    progress: ProgressMonitor
    healer: ServerHealer | None
    reader: GroupReader
    trainer: Trainer
    _saved_at: float
    _pushed_version: int
    _last_sync_bytes: int

    # ---------------------------------------------------------------- start-up

    def _load_model(self, source: Path, advantage_fn: AdvantageFn | None) -> None:
        """Seed, load the policy from ``source`` (a checkpoint or the model) and build the
        trainer; under FSDP2 also the unsharded CPU copy that pushes and checkpoints read."""
        seed_everything(self.config.seed)
        self.tokenizer_src = source
        self.policy = load_policy(source, self.config, self.dist)
        self.sharded = self.dist is not None and self.dist.fsdp
        self.host: torch.nn.Module | None = None
        self.host_peft: Any = None  # the host copy's PeftModel under LoRA (saves the adapter)
        if self.sharded:
            from gspo_rl.learner.parallel.fsdp import load_host_copy

            self.host, self.host_peft = load_host_copy(source, self.config)
        self.trainer = Trainer(self.policy, self.config, advantage_fn, dist=self.dist)

    def _param_counts(self) -> dict[str, int]:
        """Trainable vs total parameters (the start record; LoRA trains a small share)."""
        trainable, total = count_params(self.policy.model)
        log.info("trainable %s / total %s params", f"{trainable:,}", f"{total:,}")
        return {"trainable_params": trainable, "total_params": total}

    def _restore(self, ckpt: Checkpoint) -> None:
        state = ckpt.trainer_state(map_location="cpu" if self.sharded else self.policy.device)
        self.trainer.load_state_dict(state)
        restore_rng(state["rng"])
        self.step, self.version = ckpt.state.step, ckpt.state.version
        self.groups_trained = ckpt.state.groups_trained
        self.tokens_trained = int(ckpt.state.extra.get("tokens_trained", 0))
        self.lineage = Lineage.from_json(ckpt.state.extra.get("lineage"))

    def _published_version(self) -> int:
        raw = self.client.hget(self.keys.learner_state, "version")
        return int(raw) if raw is not None else -1

    def _resync(self) -> None:
        """At start, move past any version a previous learner published, and push: restarted
        servers are back at their initial weights, the others may hold unsaved ones."""
        published = self._published_version()
        if published > self.version:
            base, self.version = self.version, published + 1
            self.lineage.resumed(base, self.version)
            log.info("servers may hold unsaved weights up to version %d: pushing version %d "
                     "(the weights of version %d); groups sampled before are judged against "
                     "these weights, not the lost versions %d..%d", published, self.version,
                     base, base + 1, published)
        self._push()

    # ---------------------------------------------------------------- side effects

    def _export(self, with_optimizer: bool) -> tuple[torch.nn.Module, dict | None]:
        """The model to push or save, and the trainer state when asked. Under FSDP2 the other
        ranks are told to join the gather first."""
        if not self.sharded:
            return self.policy.model, self.trainer.state_dict() if with_optimizer else None
        assert self.dist is not None and self.host is not None
        send(self.dist, Gather(with_optimizer))
        return self.host, export_full(self.trainer, self.host, with_optimizer)

    def _push(self) -> float:
        """Publish the version, then push the weights; returns the seconds it took."""
        t0 = time.perf_counter()
        self._push_ok()
        return time.perf_counter() - t0

    def _push_ok(self) -> bool:
        self._publish_state()
        try:
            report = self.sync.push(self._export(with_optimizer=False)[0], self.version)
        finally:
            self.progress.clear("weight_push")
        if not report.ok:
            log.warning("weight push of version %d did not reach every server", self.version)
        self._last_sync_ok = bool(report.ok)
        self._last_sync_bytes = int(report.bytes_sent)
        self._pushed_version = self.version
        if self.healer is not None:
            self.healer.pushed(getattr(report, "rejected", None))
        return self._last_sync_ok

    def _checkpoint(self, force: bool) -> float:
        """Checkpoint (every ``save_every`` steps, or when forced with steps unsaved), then
        ack what it covers. Without ``save_dir``: ack at once."""
        t0 = time.perf_counter()
        cfg = self.config
        if cfg.save_dir is not None:
            if not (self.pending_ack and (force or self._save_due())):
                return 0.0
            if cfg.max_staleness is not None:
                self.lineage.forget_before(self.version, cfg.max_staleness)
            state = LearnerState(self.step, self.version, list(self.pending_ack),
                                 self.groups_trained, extra={
                                     "run_id": self.run_id, "lineage": self.lineage.to_json(),
                                     "tokens_trained": self.tokens_trained})
            model, trainer_state = self._export(with_optimizer=True)
            assert trainer_state is not None
            peft = self.host_peft if self.sharded else self.policy.peft
            if peft is not None:  # the adapter alone, in PEFT's format
                model = peft
            save_checkpoint(cfg.save_dir, model, trainer_state, state,
                            tokenizer_src=self.tokenizer_src, keep_last=cfg.keep_last)
            self._saved_at = time.monotonic()
            self.metrics.event({"event": "checkpoint", "run_id": self.run_id,
                                "step": self.step, "groups": len(self.pending_ack),
                                "time_checkpoint_s": time.perf_counter() - t0})
        try:
            self.reader.ack(self.pending_ack)
            self.recent_acked.extend(self.pending_ack)
            self.pending_ack = []
        except redis.RedisError as exc:  # kept: the next checkpoint records them again
            log.warning("ack failed (%s); will retry after the next checkpoint", exc)
        return time.perf_counter() - t0

    def _save_due(self) -> bool:
        """Every ``save_every`` steps, or ``save_every_s`` after the last checkpoint."""
        every_s = self.config.save_every_s
        return (self.step % self.config.save_every == 0
                or (every_s is not None and time.monotonic() - self._saved_at >= every_s))

    def _publish_state(self) -> None:
        publish_state(self.client, self.keys, state_fields(
            self.config, self.version, self.step, self.groups_trained,
            finished=self.target.finished, tokens_trained=self.tokens_trained,
            rewards=self.trained_rewards))

    def _record(self, batch: Batch, metrics: dict[str, float], invalid: int,
                times: dict[str, float | None]) -> dict[str, Any]:
        try:
            counters = read_counters(self.client, self.keys)
        except redis.RedisError:
            counters = {}
        return {
            "event": "step", "run_id": self.run_id, "step": self.step,
            "version": self.version, "time": time.time(),
            **step_fields(batch, metrics, times, counters, self.groups_trained, invalid,
                          self.tokens_trained),
            "sync_ok": getattr(self, "_last_sync_ok", True),
            "registry_rejected": self.healer.rejected if self.healer else 0,
            **self.progress.progressed(),
        }
