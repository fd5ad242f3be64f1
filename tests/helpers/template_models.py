"""Copies of the tiny model that carry real chat templates (tests/data, see its README).

- ``qwen3``: Qwen3-0.6B's template; ``<think>`` / ``</think>`` as added tokens that are *not*
  special (as in Qwen3's tokenizer); ``<|im_end|>`` ends a turn.
- ``llama3``: Llama-3.3's template (tools as JSON in the first user message);
  ``<|begin_of_text|>`` (BOS), ``<|start_header_id|>``, ``<|end_header_id|>``, ``<|eot_id|>``
  (EOS), ``<|eom_id|>`` and ``<|python_tag|>`` as special tokens.

The tiny tokenizer's vocabulary is full, so the model's embeddings are resized to the new
tokens (``make_template_model``); the weights stay random and seeded. ``teach_conversation``
trains a copy on one conversation (``LOOKUP_CONVERSATIONS``, run by ``lookup_episode``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from tokenizers import AddedToken

from gspo_rl.tiny_model import build_tokenizer, make_tiny_model

DATA = Path(__file__).resolve().parents[1] / "data"
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


def teach_conversation(path: Path, conversation: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None, steps: int = 600,
                       max_loss: float = 5e-3, lr: float = 3e-3) -> None:
    """Train the model at ``path`` (supervised, on its assistant turns only: from the
    generation prompt to the end-of-turn token) until it reproduces ``conversation``: its
    final mean loss must be under ``max_loss``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gspo_rl.contract.chat.messages import end_token_ids

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    def render(msgs: list[dict[str, Any]], gen: bool) -> list[int]:
        return list(tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=gen,
                                            tokenize=True, return_dict=False))

    ids = render(conversation, False)
    eot = set(end_token_ids(tok))
    mask = torch.zeros(len(ids), dtype=torch.bool)
    for i, msg in enumerate(conversation):
        if msg["role"] == "assistant":
            start = len(render(conversation[:i], True))
            end = next(j for j in range(start, len(ids)) if ids[j] in eot)
            mask[start:end + 1] = True
    x = torch.tensor([ids])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            opt = torch.optim.Adam(model.parameters(), lr=lr)
            # cosine from 3e-3 down: Adam at 1e-2 leapt out of the minimum it had found and
            # settled above it on some CPUs (their kernels round differently)
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=1e-5)
            for _ in range(steps):
                logits = model(input_ids=x).logits[0, :-1]
                loss = torch.nn.functional.cross_entropy(logits[mask[1:]], x[0, 1:][mask[1:]])
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                if loss.item() < 1e-3:
                    break
    finally:
        torch.set_num_threads(threads)
    # 5e-3 mean loss (the default): at temperature 0.3 the model then samples the conversation
    assert loss.item() < max_loss, f"the tiny model did not learn the conversation: {loss.item()}"
    model.save_pretrained(path, safe_serialization=True)


LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "The value stored under a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}
"""The tool of the taught lookup conversations (``teach_conversation``)."""
LOOKUP_CALL = {"id": "call_0", "type": "function",
               "function": {"name": "lookup", "arguments": {"key": "k"}}}
LOOKUP_CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "qwen3": [
        {"role": "user", "content": "What is the value of k?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should look k up.",
         "tool_calls": [LOOKUP_CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "42"},
        {"role": "assistant", "content": "k is 42.", "reasoning_content": "The tool said 42."},
    ],
    "llama3": [
        {"role": "system", "content": "Use the lookup tool."},
        {"role": "user", "content": "What is the value of k?"},
        {"role": "assistant", "content": "", "tool_calls": [LOOKUP_CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "42"},
        {"role": "assistant", "content": "k is 42."},
    ],
}
"""A conversation that calls ``lookup`` once and answers, per family, in the form chat
templates read (``teach_conversation`` renders it as is); ``as_sent`` gives the API's form."""


def as_sent(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``conversation`` as the OpenAI API carries it: beside tool calls, an assistant's empty
    content is null and the arguments are a JSON string (the server's ``template_messages``
    turns it back)."""
    out = []
    for m in conversation:
        if m.get("tool_calls"):
            m = {**m, "content": m["content"] or None, "tool_calls": [
                {**c, "function": {**c["function"],
                                   "arguments": json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]]}
        out.append(m)
    return out


def echo_assistant(message: Any) -> dict[str, Any]:
    """An assistant message of the openai client as an agent sends it back (reasoning_content
    included)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    reasoning = (message.model_extra or {}).get("reasoning_content")
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    if message.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
    return out


def lookup_episode(url: str, family: str) -> tuple[list[Any], str]:
    """An agent on the rollout server at ``url``: ``LOOKUP_CONVERSATIONS[family]`` up to its
    first assistant turn, then whatever the model does (two turns at most), ``lookup``
    answering. Returns the turns' choices and the episode's rollout id."""
    import httpx
    import openai

    from tests.helpers.serving import API_KEY, MODEL_NAME

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    g = httpx.post(f"{url}/v1/groups", json={"size": 1}, timeout=30,
                   headers={"Authorization": f"Bearer {API_KEY}"}).json()
    rid = g["rollout_ids"][0]
    conv = LOOKUP_CONVERSATIONS[family]
    messages = conv[:next(i for i, m in enumerate(conv) if m["role"] == "assistant")]
    choices: list[Any] = []
    for _ in range(2):
        c = client.chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=[LOOKUP], max_tokens=48,
            temperature=0.3, seed=1, extra_body={"rollout_id": rid}).choices[0]
        choices.append(c)
        if not c.message.tool_calls:
            break
        (call,) = c.message.tool_calls
        value = {"k": "42"}.get(json.loads(call.function.arguments)["key"], "")
        messages = [*messages, echo_assistant(c.message),
                    {"role": "tool", "tool_call_id": call.id, "content": value}]
    return choices, rid
