"""A training step's figures, from its microbatches and minibatches (pure arithmetic, no
I/O): loss metrics accumulated per microbatch (``accumulate``: the loss scaled, the rest as
sums weighted by the tokens or sequences they cover), combined over the step's minibatches
(``combine_minibatches``), and the sums behind the importance weights' figures
(``is_sums``)."""

from __future__ import annotations


def is_sums() -> dict[str, float]:
    """Sums behind the IS weights' step figures (``gspo_rl.learner.trainer.Trainer._set_prox``)."""
    return {"w": 0.0, "units": 0.0, "capped": 0.0, "abs_lr": 0.0, "rows": 0.0}


# Loss metrics averaged over tokens vs over sequences when minibatches are combined.
TOKEN_WEIGHTED = ("clip_fraction", "clip_low_fraction", "clip_high_fraction", "gate_mean")
SEQ_WEIGHTED = ("ratio_mean", "abs_log_ratio_mean")


def accumulate(acc: dict[str, float], metrics: dict[str, float], loss_scale: float) -> None:
    """Add one microbatch's loss metrics: the loss scaled, the rest as weighted sums."""
    n_seq, n_tok = metrics["num_sequences"], metrics["num_tokens"]
    acc["loss"] += metrics["loss"] * loss_scale
    acc["num_sequences"] += n_seq
    acc["num_tokens"] += n_tok
    for k in TOKEN_WEIGHTED:
        if k in metrics:
            acc[k + "@tok"] = acc.get(k + "@tok", 0.0) + metrics[k] * n_tok
    for k in SEQ_WEIGHTED:
        if k in metrics:
            acc[k + "@seq"] = acc.get(k + "@seq", 0.0) + metrics[k] * n_seq


def combine_minibatches(per_mb: list[dict[str, float]]) -> dict[str, float]:
    """Step metrics from the minibatches': loss and grad norm averaged over minibatches,
    ratios and clip fractions weighted by the sequences / tokens they cover."""
    done = [m for m in per_mb if m]
    if not done:
        return {"optimizer_steps": 0.0}
    n_seq = sum(m["num_sequences"] for m in done)
    n_tok = sum(m["num_tokens"] for m in done)
    out = {
        "loss": sum(m["loss"] for m in done) / len(done),
        "grad_norm": sum(m["grad_norm"] for m in done) / len(done),
        "grad_norm_max": max(m["grad_norm"] for m in done),
        "optimizer_steps": float(sum(1 for m in done if "skipped" not in m)),
        "skipped_updates": float(sum(1 for m in done if "skipped" in m)),
    }
    for k in TOKEN_WEIGHTED:
        if k + "@tok" in done[0]:
            out[k] = sum(m[k + "@tok"] for m in done) / max(n_tok, 1)
    for k in SEQ_WEIGHTED:
        if k + "@seq" in done[0]:
            out[k] = sum(m[k + "@seq"] for m in done) / max(n_seq, 1)
    return out
