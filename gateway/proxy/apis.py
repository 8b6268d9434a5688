"""Validating the APIs the gateway routes besides chat and completions.

Besides the three below, vLLM's other POST routes (gateway/paths.py: tokenization, the batch
chat, SageMaker's `/invocations`, scoring and pooling) are read by `validate_other`: the model
(or the default one), the stream flag where the API streams, a prefix for affinity.

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


def validate_count_tokens(data: dict[str, Any], served: Served, prefix_chars: int) -> RequestInfo:
    """Anthropic's token count names its model, as its Messages API does."""
    return RequestInfo(model_of(data, served, True), False, None, _other_prefix(data, prefix_chars))


def validate_streamable(data: dict[str, Any], served: Served, prefix_chars: int) -> RequestInfo:
    """`/invocations` (any of vLLM's request types, by its body's shape: a chat or a
    completion may stream) and the batch chat (whose `stream` vLLM refuses by name)."""
    model, stream, user = common(data, served)
    return RequestInfo(model, stream, user, _other_prefix(data, prefix_chars))


def validate_other(data: dict[str, Any], served: Served, prefix_chars: int) -> RequestInfo:
    """Tokenization, scoring and pooling: never streamed (a `stream` field is the unit's to
    judge), the model optional as in vLLM."""
    return RequestInfo(
        model_of(data, served), False, user_of(data), _other_prefix(data, prefix_chars)
    )


def _other_prefix(data: dict[str, Any], limit: int) -> str:
    messages = data.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], list):
        messages = messages[0]  # the batch chat: a list of conversations
    if messages is not None:
        return prefix_of_messages(messages, limit)
    for name in ("prompt", "input", "query", "text", "text_1", "tokens"):
        if name in data:
            return text_prefix(data[name], limit)
    return ""


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _prefix(head: str, given: Any, limit: int) -> str:
    text = text_prefix(given, limit)
    return (head + "\x1e" + text if head else text)[:limit]
