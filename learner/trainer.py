"""One training step: a list of ready groups in, AdamW updates and metrics out.

A step is one policy version. Its rollouts are planned by ``gspo_rl.learner.data.batching``
into ``M`` minibatches, passed over ``epochs`` times; each minibatch is one optimizer step,
its microbatches accumulating gradients scaled so that their sum is the minibatch's
seq-mean-token-mean loss (``MicroBatch.loss_scale``).

pi_old, by ``LearnerConfig.pi_old``: "behavior", the servers' sampling log-probabilities
(GSPO paper, section 5.4); or "recompute", the decoupled objective: pi_prox, the weights at the
start of the step, the loss multiplied by the truncated importance weight behaviour -> proximal
at the loss's level (``gspo_rl.learner.algorithm.losses.decoupled_is_weights``: per sequence
for gspo, per token otherwise). With several minibatches (or epochs) pi_prox is a pass without
grad before the first update; with one (the default) the only update's own forward is taken at those
weights, so pi_prox is its log-probabilities, detached, and no extra pass runs (unless the
model has active dropout, whose draws would differ). Setting pi_prox also keeps each rollout's
per-token log(pi_prox / pi_behavior) (``log_ratios``; ``LearnerConfig.token_ratios``).

A minibatch whose gradient norm is not finite is skipped (``skipped_updates``), never written
into the weights. Speed (``gspo_rl.learner.model.speed``, decided once here): on CUDA bf16
weights with float32 masters, fused AdamW, packed microbatches, checkpointing by size; on the
CPU nothing changes (float32, padded, exact). Design notes: docs/design/learner-loop.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch

from gspo_rl.contract.schema import ReadyGroup
from gspo_rl.learner.algorithm.advantages import advantage_fn_for
from gspo_rl.learner.algorithm.losses import decoupled_is_weights, policy_loss
from gspo_rl.learner.algorithm.step_metrics import (
    SEQ_WEIGHTED,
    TOKEN_WEIGHTED,
    accumulate,
    combine_minibatches,
    is_sums,
)
from gspo_rl.learner.algorithm.token_ratios import LogRatios
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.data.batching import AdvantageFn, MicroBatch, MiniBatch, plan_step
from gspo_rl.learner.model.policy import Policy
from gspo_rl.learner.model.precision import MasterWeights
from gspo_rl.learner.model.speed import apply_speed, plan_speed
from gspo_rl.learner.parallel.distributed import DistContext, assign_owners
from gspo_rl.learner.parallel.fsdp import (
    FULL_FORMAT,
    Share,
    fsdp_share,
    full_optimizer_state,
    grad_norm_value,
    load_optimizer_state,
    names_to_ids,
)


def truncated_is_weights(
    prox_BT: torch.Tensor, behavior_BT: torch.Tensor, mask_BT: torch.Tensor, cap: float
) -> torch.Tensor:
    """``min(exp(mean_t(prox - behavior)), cap)`` per row over trained tokens; 1 for rows
    without any (the sequence-level weight of ``decoupled_is_weights``)."""
    return decoupled_is_weights(prox_BT, behavior_BT, mask_BT, "gspo", cap)


class Trainer:
    """Owns the optimiser; ``step`` trains on one batch of groups.

    With ``dist`` (a ``gspo_rl.learner.parallel.distributed.DistContext``) every rank calls ``step``
    with the same groups; each computes its share of the microbatches and gradients are summed
    across ranks before each optimizer step (see ``gspo_rl.learner.parallel.distributed``). With
    ``dist.fsdp`` the model is sharded (``gspo_rl.learner.parallel.fsdp``): FSDP sums the gradients
    in backward, every rank runs the same number of passes, and ``state_dict`` is a collective.
    """

    def __init__(
        self, policy: Policy, config: LearnerConfig,
        advantage_fn: AdvantageFn | None = None,
        dist: DistContext | None = None,
        lr_lambda: Callable[[int], float] | None = None,
    ) -> None:
        # None: per-token credit (gspo_rl.learner.algorithm.advantages) for the per-token kinds,
        # sequence advantages for gspo. Every data-parallel rank builds its trainer this way.
        self.policy, self.config = policy, config
        self.advantage_fn = advantage_fn or advantage_fn_for(config.loss.kind)
        self.dist = dist
        self.sharded = dist is not None and dist.fsdp
        self.speed = plan_speed(config, policy.model, policy.device, self.sharded)
        apply_speed(policy, self.speed)
        # bf16 parameters: the optimizer (and the gradient sum and clip) work on float32
        # masters; otherwise on the parameters themselves.
        self.master = (MasterWeights(policy.model, self.speed.param_dtype)
                       if self.speed.param_dtype != torch.float32 else None)
        params = (self.master.master if self.master is not None
                  else [p for p in policy.model.parameters() if p.requires_grad])
        self.params = params
        fused = {"fused": True} if self.speed.fused_adamw else {}
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, eps=config.adam_eps,
            weight_decay=config.weight_decay, **fused)
        warmup = config.warmup_steps
        # lr_lambda: the learning rate's factor at optimizer step k (default: linear warm-up)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda or (lambda k: min(1.0, (k + 1) / warmup) if warmup
                                          else 1.0))
        self._token_keys = [k for k in TOKEN_WEIGHTED
                            if k != "gate_mean" or config.loss.kind == "sapo"]
        # Each step's log(pi_prox / pi_behavior) per rollout and sampled token (recompute mode,
        # ``token_ratios``): filled by ``_set_prox``; ``log_ratios`` holds the last step's on
        # rank 0 (every rank's rollouts), {} elsewhere.
        self._ratios: LogRatios | None = None
        self.log_ratios: dict[str, np.ndarray] = {}

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict:
        """Optimiser and schedule state. Sharded: a collective (call on every rank) whose
        full, name-keyed optimiser state lands on rank 0 (see ``gspo_rl.learner.parallel.fsdp``)."""
        if self.sharded:
            return {"optimizer": full_optimizer_state(self.policy.model, self.optimizer),
                    "optimizer_format": FULL_FORMAT, "scheduler": self.scheduler.state_dict()}
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict(),
                                 "scheduler": self.scheduler.state_dict()}
        if self.master is not None:  # the saved bf16 model alone would lose the low bits
            state["master_weights"] = self.master.state()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Either format loads in either mode (a collective when sharded)."""
        name_keyed = state.get("optimizer_format") == FULL_FORMAT
        if name_keyed and self.master is not None:  # masters are numbered like the params
            names = [n for n, p in self.policy.model.named_parameters() if p.requires_grad]
            self.optimizer.load_state_dict(names_to_ids(state["optimizer"], names))
        elif self.sharded or name_keyed:
            load_optimizer_state(self.policy.model, self.optimizer, state["optimizer"],
                                 name_keyed)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if "master_weights" in state:
            self._load_masters(state["master_weights"])

    @torch.no_grad()
    def _load_masters(self, tensors: list[torch.Tensor]) -> None:
        """float32 masters of a bf16 run: into our masters, or (a float32 run resuming it)
        straight into the parameters."""
        if self.master is not None:
            self.master.load_state(tensors)
            return
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        if len(params) != len(tensors):
            raise ValueError(f"{len(tensors)} master tensors for {len(params)} parameters")
        torch._foreach_copy_(params, [t.to(p.device) for p, t in zip(params, tensors,  # type: ignore[arg-type]  # torch wants list[Tensor] (invariant): Parameters are Tensors
                                                                      strict=True)])

    # ---------------------------------------------------------------- the step

    def step(self, groups: Sequence[ReadyGroup]) -> dict[str, float]:
        """Train on ``groups``; returns float metrics (``combine_minibatches``)."""
        t0 = time.perf_counter()
        world = self.dist.world if self.dist is not None else 1
        plan = plan_step(groups, self.config.minibatches, self.config.micro_batch_tokens,
                         self.advantage_fn, min_micro=world, packed=self.policy.packing)
        mine = [self._my_share(mb) for mb in plan.minibatches]
        metrics: dict[str, float] = {}
        epochs = self.config.epochs
        self._ratios = (LogRatios() if self.config.token_ratios
                        and self.config.pi_old == "recompute" else None)
        fused = (self.config.pi_old == "recompute" and len(mine) == 1 and epochs == 1
                 and not self._dropout())
        if self.config.pi_old == "recompute" and not fused:
            metrics.update(self._recompute(mine))
        is_acc = is_sums() if fused else None
        per_mb = [self._optimizer_step(s, is_acc) for _ in range(epochs) for s in mine]
        if is_acc is not None:
            metrics.update(self._is_summary(is_acc))
        self.log_ratios = self._take_ratios()
        if self.policy.device.type == "cuda":
            torch.cuda.synchronize(self.policy.device)
        seconds = time.perf_counter() - t0
        metrics.update(combine_minibatches(per_mb))
        metrics.update(
            compute_s=seconds, rollouts=plan.n_rollouts, tokens=plan.n_tokens,
            trained_tokens=plan.n_trained_tokens, padding_fraction=plan.padding_fraction,
            tokens_per_s=plan.n_tokens / max(seconds, 1e-9),
            trained_tokens_per_s=plan.n_trained_tokens / max(seconds, 1e-9),
            lr=cast(float, self.scheduler.get_last_lr()[0]), ranks=world,  # a float lr
        )
        return metrics

    def _my_share(self, mb: MiniBatch) -> Share:
        """This rank's microbatches of ``mb`` (all of them without data parallelism), and
        under FSDP the zero-weight passes that even out the ranks' counts."""
        if self.dist is None:
            return Share(list(mb.micro), 0, None)
        owners = assign_owners([m.n_padded_tokens for m in mb.micro], self.dist.world)
        if self.sharded:
            return fsdp_share(mb, owners, self.dist.rank, self.dist.world)
        mine = [m for m, r in zip(mb.micro, owners, strict=True) if r == self.dist.rank]
        return Share(mine, 0, None)

    def _take_ratios(self) -> dict[str, np.ndarray]:
        """The step's log-ratios (``LogRatios.take``), every rank's gathered on rank 0."""
        if self._ratios is None:
            return {}
        mine, self._ratios = self._ratios.take(), None
        if self.dist is None:
            return mine
        parts = self.dist.gather(mine)
        return {k: v for part in parts or [] for k, v in part.items()}

    def _sum(self, acc: dict[str, float]) -> dict[str, float]:
        """``acc`` summed over ranks (same keys in the same order on every rank)."""
        if self.dist is None:
            return acc
        return dict(zip(acc, self.dist.sum_floats(list(acc.values()), self.policy.device),
                        strict=True))

    def _device_batch(self, m: MicroBatch) -> dict[str, torch.Tensor]:
        dev = self.policy.device
        return {"tokens": m.tokens_BT.to(dev), "attention": m.attention_BT.to(dev),
                "temperature": m.temperature_B.to(dev), "mask": m.mask_BT.to(dev),
                "behavior": m.behavior_BT.to(dev), "advantages": m.advantages.to(dev)}

    def _logprobs(self, m: MicroBatch, d: dict[str, torch.Tensor]) -> torch.Tensor:
        """The policy's log-probs of ``m`` under each row's sampling distribution (the
        top-p / top-k cut only for batches that have one: the plain call stays the same)."""
        cut = {} if m.top_p_B is None else {"top_p_B": m.top_p_B, "top_k_B": m.top_k_B}
        return self.policy.token_logprobs(d["tokens"], d["attention"], d["temperature"],
                                          d["mask"], **cut)

    def _dropout(self) -> bool:
        """Whether a forward draws dropout (then pi_prox needs its own pass)."""
        return any(isinstance(mod, torch.nn.Dropout) and mod.p > 0 and mod.training
                   for mod in self.policy.model.modules())

    @torch.no_grad()
    def _recompute(self, shares: list[Share]) -> dict[str, float]:
        """pi_prox for every microbatch, in a pass before any update, and the truncated IS
        weights (``_set_prox``)."""
        acc = is_sums()
        for s in shares:
            self._pad_passes(s, backward=False)
        for m in (m for s in shares for m in s.micro):
            d = self._device_batch(m)
            self._set_prox(m, d, self._logprobs(m, d), acc)
        return self._is_summary(acc)

    @torch.no_grad()
    def _set_prox(self, m: MicroBatch, d: dict[str, torch.Tensor], prox: torch.Tensor,
                  acc: dict[str, float]) -> None:
        """Take ``prox`` as ``m``'s pi_prox, set its truncated IS weights, add their figures to
        ``acc``: ``is_weight_mean`` and ``is_weight_capped_fraction`` are over the units the
        weights apply to (sequences for gspo, trained tokens otherwise); the log-ratio is per
        sequence."""
        cap, kind = self.config.is_weight_cap, self.config.loss.kind
        m.old_BT = prox
        m.is_weights_B = w = decoupled_is_weights(prox, d["behavior"], d["mask"], kind, cap)
        if self._ratios is not None:
            self._ratios.add(m.rollout_ids, prox - d["behavior"], m.mask_BT)
        keep = d["mask"] > 0
        valid = keep.any(-1)
        log_w = torch.where(keep, prox - d["behavior"], 0.0).sum(-1) / keep.sum(-1).clamp(min=1)
        units = valid if w.dim() == 1 else keep
        sums = torch.stack([t.to(torch.float64) for t in (
            w[units].sum(), (w[units] >= cap).sum(), units.sum(), log_w.abs()[valid].sum(),
            valid.sum())]).tolist()
        for k, v in zip(("w", "capped", "units", "abs_lr", "rows"), sums, strict=True):
            acc[k] += float(v)

    def _is_summary(self, acc: dict[str, float]) -> dict[str, float]:
        """The IS weights' step figures from ``_set_prox``'s sums (over ranks)."""
        acc = self._sum(acc)
        n, rows = max(acc["units"], 1.0), max(acc["rows"], 1.0)
        return {"is_weight_mean": acc["w"] / n, "is_weight_capped_fraction": acc["capped"] / n,
                "prox_behavior_abs_log_ratio": acc["abs_lr"] / rows}

    def _pad_passes(self, share: Share, backward: bool) -> None:
        """FSDP's zero-weight passes: the collectives of a real pass, exact zero gradients."""
        for _ in range(share.n_pad):
            assert share.pad is not None
            d = self._device_batch(share.pad)
            lp = self._logprobs(share.pad, d)
            if backward:
                (lp.sum() * 0.0).backward()

    def _optimizer_step(self, share: Share, is_acc: dict[str, float] | None = None
                        ) -> dict[str, float]:
        """Accumulate the minibatch's gradient over (this rank's share of) its microbatches,
        sum across ranks, clip, step. ``is_acc``: pi_prox is each microbatch's own forward,
        detached (``step``: one minibatch), its IS figures summed there."""
        micro = share.micro
        self.optimizer.zero_grad(set_to_none=True)
        self._pad_passes(share, backward=True)
        acc = {"loss": 0.0, "num_sequences": 0.0, "num_tokens": 0.0,
               **{k + "@tok": 0.0 for k in self._token_keys},
               **{k + "@seq": 0.0 for k in SEQ_WEIGHTED}}
        for m in micro:
            if m.n_valid == 0:
                continue
            d = self._device_batch(m)
            lp = self._logprobs(m, d)
            if is_acc is not None:
                self._set_prox(m, d, lp.detach(), is_acc)
            old = m.old_BT if m.old_BT is not None else d["behavior"]
            out = policy_loss(lp, old, d["advantages"], d["mask"], self.config.loss,
                              is_weights=m.is_weights_B)
            self.backward(out.loss * m.loss_scale)
            accumulate(acc, out.metrics, m.loss_scale)
        if self.dist is not None and not self.sharded:  # FSDP reduced them in backward
            self.dist.sum_grads(self.params)
        acc = self._sum(acc)
        if acc["num_sequences"] == 0:
            return {}
        acc["grad_norm"] = grad_norm = self.clip_and_step()
        if not math.isfinite(grad_norm):
            acc["skipped"] = 1.0
        return acc

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate ``loss``'s gradient (into the float32 masters with bf16 parameters)."""
        loss.backward()
        if self.master is not None:
            self.master.accumulate_grads()

    def clip_and_step(self) -> float:
        """Clip the accumulated gradient to ``grad_clip`` and take one optimizer and schedule
        step, unless its norm is not finite (the update is then skipped, never written into
        the weights); clears the gradient. Returns the norm before clipping."""
        clip = self.config.grad_clip if self.config.grad_clip is not None else math.inf
        grad_norm = grad_norm_value(torch.nn.utils.clip_grad_norm_(self.params, clip))
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            if self.master is not None:
                self.master.copy_to_model()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm
