"""Start-up pieces of the learner process: the weight sync it pushes with, the seeds, the
checkpoint it resumes from, the experiment trackers (``gspo_rl.learner.loop`` wires them)."""

from __future__ import annotations

import logging

import numpy as np
import redis
import torch

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.checkpoint.store import (
    Checkpoint,
    SaveDirError,
    list_checkpoints,
    load_latest,
    remove_partial,
)
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.model.lora import check_matches, is_adapter_dir
from gspo_rl.learner.tracking.backends import open_tracker
from gspo_rl.learner.tracking.base import RunInfo, Tracker
from gspo_rl.learner.tracking.run_info import code_tags
from gspo_rl.learner.weights.base import NoSync, WeightSync

log = logging.getLogger("gspo_rl.learner.loop")


def build_weight_sync(config: LearnerConfig, client: redis.Redis) -> WeightSync:
    """The ``WeightSync`` that ``config.weight_sync`` names."""
    if config.weight_sync == "none":
        return NoSync(client, Keys(config.key_prefix))
    from gspo_rl.learner.weights.broadcast import BroadcastSync

    key = config.admin_key.get_secret_value() if config.admin_key is not None else None
    return BroadcastSync(client, Keys(config.key_prefix), admin_key=key,
                         master_addr=config.sync_master_addr, backend=config.sync_backend,
                         timeout_s=config.sync_timeout_s)


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def checkpoint_to_resume(cfg: LearnerConfig) -> Checkpoint | None:
    """The newest checkpoint under ``save_dir`` with ``resume``; partial ones (a crash during
    a save) are removed first. Refuses to train over existing checkpoints without ``resume``."""
    if cfg.save_dir is None:
        return None
    for name in remove_partial(cfg.save_dir):
        log.warning("removed a partial checkpoint left by a crash: %s", name)
    if cfg.resume:
        ckpt = load_latest(cfg.save_dir)
        if ckpt is not None and ckpt.state.kind == "sft":
            raise SaveDirError(
                f"save_dir {cfg.save_dir} holds gspo sft checkpoints: start RL from one with "
                f"--model {ckpt.path} and a new --save-dir (a fresh optimizer at the RL "
                "learning rate, policy version 0)")
        if ckpt is not None:
            check_lora_resume(cfg, ckpt)
        log.info("resuming from %s", ckpt.path if ckpt else "scratch (no checkpoint)")
        return ckpt
    if list_checkpoints(cfg.save_dir):
        raise SaveDirError(f"save_dir {cfg.save_dir} already holds checkpoints: pass "
                           "--resume to continue from them, or choose another directory")
    return None


def check_lora_resume(cfg: LearnerConfig, ckpt: Checkpoint) -> None:
    """A LoRA checkpoint resumes only as LoRA with the same settings, a full one only as
    full fine-tuning (their optimizer states cover different parameters)."""
    adapter = is_adapter_dir(ckpt.path)
    if adapter != (cfg.lora_rank is not None):
        what = "a LoRA adapter" if adapter else "full weights"
        raise SaveDirError(
            f"{ckpt.path} holds {what}; resume it with{'' if adapter else 'out'} --lora-rank "
            "as it was trained, or start a new --save-dir (--model may name the checkpoint)")
    if adapter:
        try:
            check_matches(ckpt.path, cfg)
        except ValueError as exc:
            raise SaveDirError(str(exc)) from exc


def open_tracking(cfg: LearnerConfig, run_id: str, first_step: int,
                  kind: str = "learn") -> Tracker | None:
    """The trackers of ``cfg.report_to`` (None without any), told the run's config (the
    admin key left out), its git commit and where it resumed from."""
    if not cfg.report_to:
        return None
    tags = {**code_tags(), "kind": kind, "learner_run_id": run_id,
            "resumed_from": str(first_step)}
    return open_tracker(cfg.report_to, RunInfo(
        directory=cfg.tracking_path, config=cfg.model_dump(mode="json", exclude={"admin_key"}),
        tags=tags, name=cfg.run_name, project=cfg.tracking_project, first_step=first_step))
