"""A tiny, deterministic Qwen2-architecture model made entirely on this machine.

Tests and CPU demos need a real model directory (config, tokenizer with a chat template,
safetensors weights) that both engines can load, and nothing may come from a hub. This module
builds one in well under a second: a byte-level BPE tokenizer trained on a small inline corpus
(so any text round-trips), a Qwen2.5-style chat template with tool calls, and randomly
initialised weights drawn from a seeded generator, so the same seed gives byte-identical files.

The weights are random: the model "speaks" noise, but every code path (batching, sampling,
log-probabilities, weight updates) is exercised exactly as with a real checkpoint.
"""

from __future__ import annotations

import random
from pathlib import Path

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
HEAD_DIM = 64
# Larger than the usual 0.02 so that next-token distributions are peaked rather than nearly
# uniform: greedy decoding, stop tokens and log-probability checks then mean something.
INIT_STD = 0.1

# Qwen2.5-style template. Tool-call arguments may be a JSON string (OpenAI wire format) or an
# object; strings are emitted verbatim so they are not double-encoded.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}\
{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n\
{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) \
or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}\
{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}\
{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}\
{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

_WORDS_TEXT = (
    "the a an and or but if then else when while for to of in on at by with from as is are was "
    "were be been have has had do does did not no yes true false null none what which who how "
    "why where answer question solve compute number sum total result value name arguments "
    "function tool call response user assistant system please think step first second next "
    "finally add subtract multiply divide equals plus minus times over remainder count list "
    "word letter reverse sort weather city temperature search query find get set make give "
    "you we they it this that these those there here hello world good bad correct wrong "
    "reward score policy model token sample group learn train data test example json text"
)
_WORDS = tuple(_WORDS_TEXT.split())


def _corpus(seed: int = 1234) -> list[str]:
    """A small, fixed training corpus: words, numbers, arithmetic, JSON and chat markup."""
    rng = random.Random(seed)  # fixed: the tokenizer must not depend on the weights' seed
    lines: list[str] = []
    for _ in range(600):
        n = rng.randint(3, 12)
        words = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ",", ":", ""]))
    for _ in range(400):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*/")
        res = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / (b or 1), 2)}[op]
        lines.append(f"{a} {op} {b} = {res}")
    for _ in range(200):
        key, val = rng.choice(_WORDS), rng.choice(_WORDS)
        num = rng.randint(-50, 5000)
        lines.append(
            f'{{"name": "{key}", "arguments": {{"{val}": {num}, "x": [1, 2.5, "{key}"], '
            f'"ok": true, "v": null}}}}'
        )
    lines.append("0123456789 ()[]{}<>;:'\"`~!@#$%^&*_-+=|\\/?,.\n\t")
    return lines


def build_tokenizer(vocab_size: int):  # -> PreTrainedTokenizerFast
    """Train a byte-level BPE tokenizer (deterministic) and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is too small for the byte-level alphabet")
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
        padding_side="left",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def make_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    tie_embeddings: bool = True,
    num_layers: int = 2,
    hidden_size: int = 128,
    vocab_size: int = 1024,
) -> Path:
    """Write a tiny Qwen2 model directory to ``path`` and return it.

    ``hidden_size`` must be a multiple of the head dimension (64). Same arguments give
    byte-identical weight files. The global torch RNG state is left untouched.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden_size % HEAD_DIM:
        raise ValueError(f"hidden_size must be a multiple of {HEAD_DIM}, got {hidden_size}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    n_heads = hidden_size // HEAD_DIM
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=1 if n_heads % 2 else n_heads // 2,
        max_position_embeddings=2048,
        initializer_range=INIT_STD,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_embeddings,
        use_sliding_window=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]  # transformers types .to unbound
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,  # off: nothing truncates sampling by default
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
