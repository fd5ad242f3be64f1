"""``gspo sft``: a supervised warm start on chat demonstrations with the learner's machinery.

The learner's ``Policy`` (float32 on the CPU; on CUDA bf16 with float32 masters, packing, the
fused log-prob head, compiled layers: ``gspo_rl.learner.model.speed``) and ``Trainer`` (AdamW,
clipping, non-finite updates skipped), its checkpoints (``gspo_rl.learner.checkpoint.store``, marked
``"kind": "sft"``: ``gspo learn --model <checkpoint>`` and ``gspo serve --model <checkpoint>``
load one as it is) and its metrics (a JSONL line per step, the experiment trackers).

A step: ``batch_size`` demonstrations (``gspo_rl.learner.sft.data``), the mean negative
log-likelihood of their assistant tokens (temperature 1), one optimizer step. Epochs visit
the demonstrations in a seeded order, so a resumed run (``resume``) continues where the
checkpoint stopped. One process: no data parallelism. SIGINT / SIGTERM stop after the current
step with a checkpoint. Recipe: docs/sft.md.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gspo_rl.learner.checkpoint.store import (
    LearnerState,
    SaveDirError,
    list_checkpoints,
    load_latest,
    remove_partial,
    restore_rng,
    save_checkpoint,
)
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.parallel.loading import load_policy
from gspo_rl.learner.run import graceful_signals
from gspo_rl.learner.sft.config import SFTConfig
from gspo_rl.learner.sft.data import Demonstration, Layout, micro_batches, read_demonstrations
from gspo_rl.learner.startup import seed_everything
from gspo_rl.learner.tracking.backends import open_tracker
from gspo_rl.learner.tracking.base import RunInfo, check_installed
from gspo_rl.learner.tracking.metrics import MetricsLogger
from gspo_rl.learner.tracking.run_info import code_tags
from gspo_rl.learner.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class SFTResult:
    """What a ``gspo sft`` run did."""

    steps: int
    checkpoint: Path | None  # the last checkpoint written (None: no step was trained)
    losses: list[float] = field(default_factory=list)  # this process's steps
    skipped_too_long: int = 0  # demonstrations over ``max_length``


def lr_factor(k: int, warmup: int, total: int, schedule: str) -> float:
    """The learning rate's factor at optimizer step ``k`` (0-based) of ``total``."""
    if k < warmup:
        return (k + 1) / warmup
    if schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * (k - warmup) / max(1, total - warmup)))


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)


@torch.no_grad()
def token_nll(policy: Policy, demos: Sequence[Demonstration], budget: int,
              pad_id: int) -> dict[str, float]:
    """Mean negative log-likelihood per token of the assistant tokens (``"assistant"``) and of
    the other tokens after the first (``"other"``: prompts, tool results, template tokens)."""
    sums = {"assistant": [0.0, 0], "other": [0.0, 0]}
    for mb in micro_batches(demos, budget, pad_id, packed=policy.packing):
        lp = policy.token_logprobs(mb.tokens_BT, mb.attention_BT,
                                   torch.ones(len(mb.tokens_BT))).cpu()
        real = mb.attention_BT.bool()
        real[:, 0] = False  # the first token has no prediction
        for name, sel in (("assistant", real & (mb.mask_BT > 0)),
                          ("other", real & (mb.mask_BT == 0))):
            sums[name][0] -= float(lp[sel].sum())
            sums[name][1] += int(sel.sum())
    return {k: s / max(n, 1) for k, (s, n) in sums.items()}


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


class SupervisedRun:
    """Builds everything ``run`` needs from an ``SFTConfig``; ``run`` trains."""

    def __init__(self, cfg: SFTConfig) -> None:
        from transformers import AutoTokenizer

        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError("gspo sft runs in one process: start it without torchrun")
        check_installed(cfg.report_to)
        self.cfg, self.run_id, self._stop = cfg, uuid.uuid4().hex[:12], False
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        self.demos, self.too_long = self._read(cfg)
        ckpt = self._checkpoint_to_resume(cfg)
        self.step = ckpt.state.step if ckpt else 0
        self.steps_per_epoch = math.ceil(len(self.demos) / cfg.batch_size)
        total = cfg.epochs * self.steps_per_epoch
        self.total = min(total, cfg.max_steps) if cfg.max_steps else total
        lcfg = cfg.learner_config()
        seed_everything(cfg.seed)
        self.source = ckpt.path if ckpt else Path(cfg.model)
        self.policy = load_policy(self.source, lcfg, None)
        self.trainer = Trainer(self.policy, lcfg, lr_lambda=lambda k: lr_factor(
            k, cfg.warmup_steps, self.total, cfg.lr_schedule))
        if ckpt is not None:
            state = ckpt.trainer_state(map_location=self.policy.device)
            self.trainer.load_state_dict(state)
            restore_rng(state["rng"])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        self.data_digest = _digest(cfg.data)
        if ckpt is not None and ckpt.state.extra.get("data_sha256") != self.data_digest:
            log.warning("%s changed since the checkpoint: the epochs' order is not the one "
                        "the earlier steps saw", cfg.data)
        tracker = open_tracker(cfg.report_to, RunInfo(
            directory=lcfg.tracking_path, config=cfg.model_dump(mode="json"),
            tags={**code_tags(), "kind": "sft", "sft_run_id": self.run_id,
                  "resumed_from": str(self.step)},
            name=cfg.run_name, project=cfg.tracking_project, first_step=self.step))
        self.metrics = MetricsLogger(cfg.metrics_path, console=False, tracker=tracker,
                                     first_step=self.step)

    def _read(self, cfg: SFTConfig) -> tuple[list[Demonstration], int]:
        layout = Layout(self.tokenizer, cfg.chat_template_kwargs, cfg.sanitize_control_tokens)
        demos = read_demonstrations(Path(cfg.data), layout)
        kept = [d for d in demos if cfg.max_length is None or len(d) <= cfg.max_length]
        if len(kept) < len(demos):
            log.warning("%d of %d demonstrations are longer than max_length %d tokens: left "
                        "out", len(demos) - len(kept), len(demos), cfg.max_length)
        if not kept:
            raise ValueError(f"no demonstration of {cfg.data} fits max_length {cfg.max_length}")
        return kept, len(demos) - len(kept)

    @staticmethod
    def _checkpoint_to_resume(cfg: SFTConfig):  # noqa: ANN205 - a Checkpoint or None
        remove_partial(cfg.save_dir)
        found = list_checkpoints(cfg.save_dir)
        if found and not cfg.resume:
            raise SaveDirError(f"save_dir {cfg.save_dir} already holds checkpoints: pass "
                               "--resume to continue that run, or choose another directory")
        ckpt = load_latest(cfg.save_dir) if cfg.resume else None
        if ckpt is not None and ckpt.state.kind != "sft":
            raise SaveDirError(f"save_dir {cfg.save_dir} holds RL checkpoints (gspo learn), "
                               "not gspo sft's: choose another directory")
        return ckpt

    # ---------------------------------------------------------------- the loop

    @property
    def stop_requested(self) -> bool:
        return self._stop

    def request_stop(self) -> None:
        self._stop = True

    def run(self) -> SFTResult:
        """Train to ``total`` steps (or a stop request), checkpointing; returns the result."""
        result = SFTResult(self.step, None, skipped_too_long=self.too_long)
        self.metrics.event({"event": "start", "run_id": self.run_id, "time": time.time(),
                            "resumed_from": self.step, "demonstrations": len(self.demos),
                            "steps": self.total})
        try:
            with graceful_signals(self):
                while self.step < self.total and not self._stop:
                    result.losses.append(self._train_step())
                    if self.step % self.cfg.save_every == 0:
                        result.checkpoint = self._save()
            if result.losses and (result.checkpoint is None
                                  or self.step % self.cfg.save_every):
                result.checkpoint = self._save()
        finally:
            self.metrics.event({"event": "stop", "run_id": self.run_id, "step": self.step,
                                "time": time.time()})
            self.metrics.close()
        result.steps = self.step
        return result

    def _batch(self, step: int) -> list[Demonstration]:
        epoch, k = divmod(step, self.steps_per_epoch)
        order = epoch_order(len(self.demos), epoch, self.cfg.seed, self.cfg.shuffle)
        bs = self.cfg.batch_size
        return [self.demos[i] for i in order[k * bs:(k + 1) * bs]]

    def _train_step(self) -> float:
        t0 = time.perf_counter()
        demos = self._batch(self.step)
        n_target = sum(int(d.loss_mask.sum()) for d in demos)
        lr = self.trainer.scheduler.get_last_lr()[0]
        self.trainer.optimizer.zero_grad(set_to_none=True)
        nll = 0.0
        for mb in micro_batches(demos, self.cfg.micro_batch_tokens, self.pad_id,
                                packed=self.policy.packing):
            lp = self.policy.token_logprobs(mb.tokens_BT, mb.attention_BT,
                                            torch.ones(len(mb.tokens_BT)), mb.mask_BT)
            loss = -(lp * mb.mask_BT.to(lp.device)).sum() / n_target
            self.trainer.backward(loss)
            nll += float(loss.detach())
        grad_norm = self.trainer.clip_and_step()
        self.step += 1
        seconds = time.perf_counter() - t0
        tokens = sum(len(d) for d in demos)
        self.metrics.event({
            "event": "sft", "run_id": self.run_id, "step": self.step, "time": time.time(),
            "epoch": (self.step - 1) // self.steps_per_epoch + 1, "loss": nll, "lr": lr,
            "grad_norm": grad_norm, "skipped_update": not math.isfinite(grad_norm),
            "demonstrations": len(demos), "tokens": tokens, "trained_tokens": n_target,
            "tokens_per_s": tokens / max(seconds, 1e-9), "time_compute_s": seconds})
        log.info("sft step %d/%d epoch %d loss %.4g lr %.3g gnorm %.3g tok/s %.0f", self.step,
                 self.total, (self.step - 1) // self.steps_per_epoch + 1, nll, lr, grad_norm,
                 tokens / max(seconds, 1e-9))
        return nll

    def _save(self) -> Path:
        t0 = time.perf_counter()
        state = LearnerState(self.step, 0, extra={
            "kind": "sft", "run_id": self.run_id, "data": self.cfg.data,
            "data_sha256": self.data_digest})
        path = save_checkpoint(self.cfg.save_dir, self.policy.model, self.trainer.state_dict(),
                               state, tokenizer_src=self.source, keep_last=self.cfg.keep_last)
        self.metrics.event({"event": "checkpoint", "run_id": self.run_id, "step": self.step,
                            "path": str(path), "time_checkpoint_s": time.perf_counter() - t0})
        return path


def run_sft(cfg: SFTConfig) -> SFTResult:
    """Train ``cfg`` to its end (``gspo sft``); SIGINT / SIGTERM stop after the current step
    with a checkpoint."""
    return SupervisedRun(cfg).run()
