"""OpenAI chat messages in the form chat templates read, and the tokens that end a turn.

``template_messages``: ``developer`` becomes ``system``; text content parts are joined (any
other part type is refused with ``ContentError``); an assistant's null content beside tool
calls becomes ``""``; tool-call arguments that are a JSON object string become the object
(Qwen-style templates ``tojson`` them; a string would be encoded twice). ``end_token_ids``:
EOS and the end-of-turn markers a tokenizer has, where an assistant turn ends.
"""

from __future__ import annotations

import json
from typing import Any

# Chat turns end at these tokens when the tokenizer has them (Qwen: <|im_end|>), besides EOS.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>")


class ContentError(ValueError):
    """A message content part this text-only templating cannot render."""


def content_text(content: Any) -> str | None:
    """OpenAI content: a string, None, or a list of parts of which only text is supported."""
    if content is None or isinstance(content, str):
        return content
    texts = []
    for part in content:
        part_type = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if part_type != "text" or text is None:
            raise ContentError(f"unsupported content part type {part_type!r}: only text "
                               "is rendered, send parts of type 'text'")
        texts.append(text)
    return "".join(texts)


def template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """An assistant tool call as templates expect it: ``arguments`` as an object when the
    wire string is a JSON object, otherwise unchanged."""
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            fn["arguments"] = parsed
    return {**call, "function": fn}


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages (as dicts) -> the dicts chat templates read."""
    out = []
    for m in messages:
        content = content_text(m.get("content"))
        if content is None and m["role"] == "assistant":
            # OpenAI sends null content beside tool calls; real templates (Qwen3's) call
            # string methods on it.
            content = ""
        msg: dict[str, Any] = {"role": "system" if m["role"] == "developer" else m["role"],
                               "content": content}
        for key in ("name", "tool_call_id", "reasoning_content"):
            if m.get(key) is not None:
                msg[key] = m[key]
        if m.get("tool_calls"):
            msg["tool_calls"] = [template_tool_call(c) for c in m["tool_calls"]]
        out.append(msg)
    return out


def end_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """EOS and end-of-turn ids: where an assistant turn (or a completion) ends. End-of-turn
    markers are always added tokens: looking them up there avoids building the whole
    vocabulary dict (150k entries for Qwen) on every request."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    added = tokenizer.get_added_vocab()
    ids.update(added[t] for t in END_OF_TURN_TOKENS if t in added)
    return tuple(sorted(ids))
