"""Validating the APIs the gateway routes besides chat and completions.

`/v1/responses` (OpenAI's Responses API), `/v1/messages` (Anthropic's Messages API) and
`/v1/embeddings` go to the units whose kind serves them (gateway/paths.py: a stock vLLM, an
OpenAI-compatible server; the builtin engine serves chat and completions only). As for chat,
only the model and the stream flag are checked; the input the affinity key is made of is read,
not judged (the unit does). They are routed, admitted, retried before the first byte and
cancelled like chat.

They are not resumed after the first byte: their streams carry no token ids to continue from (vLLM's
`return_token_ids` belongs to chat and completions), and a Responses or Messages stream is a
sequence of typed events whose item ids and indexes a continuation could not reproduce.
"""

from __future__ import annotations

from typing import Any

from gateway.proxy.validation import (
    RequestInfo,
    Served,
    common,
    model_of,
    prefix_of_messages,
    text_prefix,
    user_of,
)


def validate_responses(data: dict[str, Any], served: Served, prefix_chars: int) -> RequestInfo:
    model, stream, user = common(data, served)
    instructions = data.get("instructions")
    head = instructions if isinstance(instructions, str) else ""
    return RequestInfo(model, stream, user, _prefix(head, data.get("input"), prefix_chars))


def validate_messages(data: dict[str, Any], served: Served, prefix_chars: int) -> RequestInfo:
    """Anthropic's API names its model always (vLLM refuses a request without one too)."""
    model, stream, _ = common(data, served, model_required=True)
    messages = data.get("messages")
    system = data.get("system")
    head = system if isinstance(system, str) else ""
    metadata = data.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    prefix = prefix_of_messages([{"content": head}, *_listed(messages)], prefix_chars)
    return RequestInfo(model, stream, user if isinstance(user, str) else None, prefix)


def validate_embeddings(data: dict[str, Any], served: Served, prefix_chars: int) -> RequestInfo:
    """An embedding is never streamed, whatever the body says (vLLM ignores `stream` here);
    its input is `input`, or `messages` (vLLM's chat form)."""
    model = model_of(data, served)
    given = data.get("input")
    if given is None:
        prefix = prefix_of_messages(data.get("messages"), prefix_chars)
    else:
        prefix = _prefix("", given, prefix_chars)
    return RequestInfo(model, False, user_of(data), prefix)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _prefix(head: str, given: Any, limit: int) -> str:
    text = text_prefix(given, limit)
    return (head + "\x1e" + text if head else text)[:limit]
