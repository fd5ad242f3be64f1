"""Copies of the tiny model that carry real chat templates (tests/data, see its README).

- ``qwen3``: Qwen3-0.6B's template; ``<think>`` / ``</think>`` as added tokens that are *not*
  special (as in Qwen3's tokenizer); ``<|im_end|>`` ends a turn.
- ``llama3``: Llama-3.3's template (tools as JSON in the first user message);
  ``<|begin_of_text|>`` (BOS), ``<|start_header_id|>``, ``<|end_header_id|>``, ``<|eot_id|>``
  (EOS), ``<|eom_id|>`` and ``<|python_tag|>`` as special tokens.

The tiny tokenizer's vocabulary is full, so the model's embeddings are resized to the new
tokens (``make_template_model``); the weights stay random and seeded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from tokenizers import AddedToken

from server.tiny_model import build_tokenizer, make_tiny_model

DATA = Path(__file__).parent / "data"
Family = Literal["qwen3", "llama3"]
TEMPLATES = {"qwen3": "qwen3_chat_template.jinja", "llama3": "llama3.3_chat_template.jinja"}
LLAMA3_SPECIAL = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|eom_id|>", "<|python_tag|>")
VOCAB = 1024


def template_text(family: Family) -> str:
    return (DATA / TEMPLATES[family]).read_text()


def template_tokenizer(family: Family) -> Any:
    """The tiny tokenizer with ``family``'s added tokens and chat template."""
    tok = build_tokenizer(VOCAB)
    if family == "qwen3":
        tok.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t in ("<think>", "</think>")])
    else:
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL],
                       special_tokens=True)
        tok.bos_token = "<|begin_of_text|>"
        tok.eos_token = "<|eot_id|>"
    tok.chat_template = template_text(family)
    return tok


def make_template_model(path: Path, family: Family, seed: int = 0) -> Path:
    """A tiny model directory with ``family``'s tokenizer and template (embeddings resized)."""
    import torch
    from transformers import AutoModelForCausalLM

    make_tiny_model(path, seed=seed, vocab_size=VOCAB)
    tok = template_tokenizer(family)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.resize_token_embeddings(len(tok), mean_resizing=False)
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = tok.eos_token_id
        cfg.bos_token_id = tok.bos_token_id if tok.bos_token_id is not None else cfg.bos_token_id
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path
