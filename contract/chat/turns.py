"""Where a model's turn ends in a conversation's tokens: the rule by which a multi-turn
episode grows (the server, ``gspo_rl.server.rollouts.episodes``) and by which a supervised
warm start lays out a demonstration (``gspo_rl.learner.sft``), so that both train on the same
tokens.

A conversation's trajectory is the first turn's prompt, then per model turn: the tokens the
model wrote (to its end-of-turn token), then what the template renders after that turn in the
next turn's full rendering (the end-of-turn marker when the model did not write it, the new
messages, the generation prompt). The model's turn is found by counting end-of-turn tokens:
the previous rendering held ``eot_count`` of them, so the next one's turn ends at the
``eot_count``-th (0-based); the tokens before it are never re-tokenised.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def after_turn(full: Sequence[int], eot_count: int, eot_ids: Collection[int],
               last_token: int | None) -> list[int] | None:
    """What follows the model's turn in ``full`` (the template's rendering of the next turn's
    prompt): from its ``eot_count``-th end-of-turn token on, that token left out when it is
    the one the model ended with (``last_token``). None: ``full`` has no such token (the
    template is not supported)."""
    seen = 0
    for j, t in enumerate(full):
        if t in eot_ids:
            if seen == eot_count:
                return list(full[j + 1:] if t == last_token else full[j:])
            seen += 1
    return None


def count_eot(ids: Sequence[int], eot_ids: Collection[int]) -> int:
    """How many end-of-turn tokens ``ids`` holds."""
    return sum(1 for t in ids if t in eot_ids)
