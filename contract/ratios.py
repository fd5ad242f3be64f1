"""A trained rollout's per-token log importance ratios (``Keys.token_ratios``): what the
learner writes after each step and the dashboard's rollout browser reads.

The value is ``log(pi_prox / pi_behavior)`` of each token the model sampled (loss mask > 0),
in token order, as little-endian float16 bytes: pi_prox is the learner's probability of the
token at the weights its step started from, pi_behavior the sampler's. ``pack_log_ratios`` and
``unpack_log_ratios`` are the codec; ``at_positions`` lays the values out along the whole
rollout (NaN on the tokens the model did not sample), or says they do not fit its mask.
"""

from __future__ import annotations

import numpy as np

_F2 = np.dtype("<f2")


def pack_log_ratios(values: np.ndarray) -> bytes:
    """The key's value: ``values`` (one per sampled token, in order) as float16 bytes."""
    return np.ascontiguousarray(values, dtype=_F2).tobytes()


def unpack_log_ratios(data: bytes) -> np.ndarray:
    """float32 ``[K]``; raises ``ValueError`` on bytes that are not float16s."""
    if len(data) % _F2.itemsize:
        raise ValueError(f"{len(data)} bytes are not float16 values")
    return np.frombuffer(data, dtype=_F2).astype(np.float32)


def at_positions(loss_mask: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """float32 ``[L]``: ``values`` at the rollout's sampled tokens, NaN elsewhere; None when
    their count is not the number of sampled tokens (not this rollout's ratios)."""
    sampled = np.asarray(loss_mask) > 0
    if int(sampled.sum()) != values.shape[0]:
        return None
    out = np.full(sampled.shape[0], np.nan, dtype=np.float32)
    out[sampled] = values
    return out
