"""The hf engine's attention ("gspo_sdpa") against transformers' own "sdpa" on the tiny
model (grouped-query heads): the same logits on a padded batch, where it takes its own path,
and on an unpadded one, where it hands over to transformers."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from server.engines import hf_attention, hf_batch

PROMPTS = [[5, 6, 7], list(range(10, 31)), [100], list(range(200, 212))]


def logits(model: torch.nn.Module, prompts: list[list[int]]) -> torch.Tensor:
    ids_BT, mask_BT, pos_BT = hf_batch.left_pad(prompts, 0, torch.device("cpu"))
    with torch.inference_mode():
        return model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=pos_BT).logits


def test_same_logits_as_transformers_sdpa(tiny_model_dir: Path) -> None:
    ours = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation=hf_attention.register()).eval()
    theirs = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation="sdpa").eval()
    assert ours.config._attn_implementation == hf_attention.NAME
    assert ours.model.layers[0].self_attn.num_key_value_groups > 1  # the path under test
    for prompts in (PROMPTS, [PROMPTS[1]] * 3):  # padded (mask), then unpadded
        ids_BT, mask_BT, _ = hf_batch.left_pad(prompts, 0, torch.device("cpu"))
        got, want = logits(ours, prompts), logits(theirs, prompts)
        real = mask_BT.bool()  # padding positions' logits are meaningless either way
        torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)
