"""The locally made tiny model: deterministic bytes, a round-tripping tokenizer, the chat
template (roles, tools, tool calls, tool responses) and a loadable Qwen2 checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from typer.testing import CliRunner

from gspo_rl.cli import app
from gspo_rl.tiny_model import SPECIAL_TOKENS, make_tiny_model


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = _files(make_tiny_model(tmp_path / "a", seed=3))
    b = _files(make_tiny_model(tmp_path / "b", seed=3))
    c = _files(make_tiny_model(tmp_path / "c", seed=4))
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["tokenizer.json"] == c["tokenizer.json"]  # the tokenizer does not depend on seed


def test_config_and_weights(tiny_model_dir: Path, tiny_model_untied_dir: Path) -> None:
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64
    assert cfg["max_position_embeddings"] == 2048 and cfg["vocab_size"] == 1024
    assert cfg["tie_word_embeddings"] is True
    with safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as f:
        tied_names = set(f.keys())
        assert str(f.get_tensor("model.embed_tokens.weight").dtype) == "torch.float32"
    with safe_open(str(tiny_model_untied_dir / "model.safetensors"), "pt") as f:
        untied_names = set(f.keys())
    assert "lm_head.weight" not in tied_names
    assert untied_names - tied_names == {"lm_head.weight"}
    tied = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    untied = AutoModelForCausalLM.from_pretrained(tiny_model_untied_dir)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    n_params = sum(p.numel() for p in tied.parameters())
    assert 200_000 < n_params < 5_000_000
    gen = GenerationConfig.from_pretrained(tiny_model_dir)
    assert gen.top_p == 1.0 and not gen.top_k  # nothing truncates sampling by default


def test_larger_shapes_and_bad_hidden_size(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "m", num_layers=3, hidden_size=256, vocab_size=2048)
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["vocab_size"]) == (3, 4, 2048)
    assert len(AutoTokenizer.from_pretrained(path)) <= 2048
    with pytest.raises(ValueError, match="multiple of 64"):
        make_tiny_model(tmp_path / "bad", hidden_size=100)


@pytest.mark.parametrize("text", [
    "Hello world! 12 + 345 = 357",
    '{"name": "add", "arguments": {"a": [1, 2.5], "ok": true, "v": null}}',
    "  leading spaces, tabs\tand\nnew lines\n\n",
    "ünïcödé, 漢字 and emoji 😀 round-trip byte by byte",
])
def test_tokenizer_round_trip(tiny_model_dir: Path, text: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert all(0 <= i < 1024 for i in ids)


def test_special_tokens(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(tok) == 1024
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for special in SPECIAL_TOKENS:
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special
    assert len(set(tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)))) == len(SPECIAL_TOKENS)
    ids = tok.encode("a<tool_call>b", add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<tool_call>") in ids


def test_chat_template_roles_and_tools(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 1}}},
        ]},
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": "5"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                   add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(tools[0]) in text
    assert "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n" in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}'
            '\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n'
            "</tool_call><|im_end|>\n") in text
    # consecutive tool results share one user turn
    assert ("<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n2\n"
            "</tool_response><|im_end|>\n") in text
    assert text.endswith("<|im_start|>assistant\n5<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
    assert ids.count(tok.convert_tokens_to_ids("<tool_call>")) == 2 + 2  # + two in the instructions
    assert tok.decode(ids) == tok.apply_chat_template(messages, tools=tools, tokenize=False)


def test_chat_template_without_tools(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nhi<|im_end|>\n")


def test_cli_writes_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["tiny-model", str(tmp_path / "m"), "--untied",
                                      "--seed", "7", "--layers", "1"])
    assert result.exit_code == 0, result.output
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False and cfg["num_hidden_layers"] == 1
    again = make_tiny_model(tmp_path / "again", seed=7, tie_embeddings=False, num_layers=1)
    assert (again / "model.safetensors").read_bytes() == (
        tmp_path / "m" / "model.safetensors").read_bytes()
