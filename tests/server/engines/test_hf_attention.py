"""The hf engine's attention ("gspo_sdpa") against transformers' own "sdpa" on the tiny
model (grouped-query heads): the same logits on a padded batch, where it takes its own path,
and on an unpadded one, where it hands over to transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend
from transformers import AutoModelForCausalLM

from gspo_rl.server.engines.hf import attention as hf_attention
from gspo_rl.server.engines.hf import batch as hf_batch

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


def _flags() -> dict[str, bool]:
    cuda = torch.backends.cuda
    return {"flash": cuda.flash_sdp_enabled(), "efficient": cuda.mem_efficient_sdp_enabled(),
            "math": cuda.math_sdp_enabled(), "cudnn": cuda.cudnn_sdp_enabled()}


def test_engine_steps_keep_cuda_sdpa_off_cudnn_and_restore_the_flags() -> None:
    """cuDNN attention builds a graph per new shape (BENCHMARKS.md, "On an H100"): an engine
    step on CUDA runs without it, the other backends stay on, and the flags come back after
    (also when the step raises). On the CPU a step changes nothing."""
    before = _flags()
    assert before["cudnn"], "PyTorch's default: cuDNN attention enabled"
    with hf_attention.step_backends(torch.device("cpu")):
        assert _flags() == before
    with hf_attention.step_backends(torch.device("cuda", 0)):
        assert _flags() == {**before, "cudnn": False}
    assert _flags() == before
    with pytest.raises(RuntimeError, match="a failed step"), \
            hf_attention.step_backends(torch.device("cuda", 0)):
        raise RuntimeError("a failed step")
    assert _flags() == before


@pytest.mark.gpu
def test_cuda_bf16_masked_attention_in_a_step_is_not_cudnn(tiny_model_dir: Path) -> None:
    """The case that was slow: bfloat16 on CUDA with a padding mask, where PyTorch 2.11 picks
    cuDNN attention on an H100. Inside a step another backend runs, and the logits match
    transformers' own "sdpa" to bfloat16 precision."""
    dev = torch.device("cuda", torch.cuda.current_device())
    q = torch.randn(4, 4, 1, 64, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(4, 4, 37, 64, device=dev, dtype=torch.bfloat16)
    mask = torch.ones(4, 1, 1, 37, dtype=torch.bool, device=dev)
    mask[:2, :, :, :5] = False
    with hf_attention.step_backends(dev):
        choice = torch._fused_sdp_choice(q, kv, kv, mask, 0.0, False)
    assert SDPBackend(choice) != SDPBackend.CUDNN_ATTENTION
    ours = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.bfloat16, attn_implementation=hf_attention.register()
    ).to(dev).eval()
    theirs = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev).eval()
    ids_BT, mask_BT, pos_BT = hf_batch.left_pad(PROMPTS, 0, dev)
    with torch.inference_mode():
        with hf_attention.step_backends(dev):
            got = ours(input_ids=ids_BT, attention_mask=mask_BT, position_ids=pos_BT).logits
        want = theirs(input_ids=ids_BT, attention_mask=mask_BT, position_ids=pos_BT).logits
    real = mask_BT.bool()
    torch.testing.assert_close(got[real].float(), want[real].float(), rtol=2e-2, atol=1e-1)
