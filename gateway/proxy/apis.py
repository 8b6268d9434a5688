"""Validating the APIs the gateway routes besides chat and completions.

`/v1/responses` (OpenAI's Responses API), `/v1/messages` (Anthropic's Messages API) and
`/v1/embeddings` go to the units whose kind serves them (gateway/paths.py: a stock vLLM, an
OpenAI-compatible server; the builtin engine serves chat and completions only). They are
validated as far as routing needs (the model, the stream flag, the input the affinity key is
made of), then routed, admitted, retried before the first byte and cancelled like chat.

They are not resumed after the first byte: their streams carry no token ids to continue from (vLLM's
`return_token_ids` belongs to chat and completions), and a Responses or Messages stream is a
sequence of typed events whose item ids and indexes a continuation could not reproduce.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.proxy.validation import RequestInfo, common, prefix_of_messages


def validate_responses(
    data: dict[str, Any], models: frozenset[str], prefix_chars: int
) -> RequestInfo:
    model, stream, user = common(data, models, ("max_output_tokens",))
    given = data.get("input")
    if given is None:
        raise InvalidRequest("missing required parameter 'input'", param="input")
    if not isinstance(given, str | list) or not given:
        raise InvalidRequest("'input' must be a non-empty string or array", param="input")
    instructions = data.get("instructions")
    head = instructions if isinstance(instructions, str) else ""
    return RequestInfo(model, stream, user, _prefix(head, given, prefix_chars))


def validate_messages(
    data: dict[str, Any], models: frozenset[str], prefix_chars: int
) -> RequestInfo:
    model, stream, _ = common(data, models, ("max_tokens",))
    if data.get("max_tokens") is None:
        raise InvalidRequest("missing required parameter 'max_tokens'", param="max_tokens")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    if not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("every item of 'messages' must be an object", param="messages")
    system = data.get("system")
    head = system if isinstance(system, str) else ""
    metadata = data.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    prefix = prefix_of_messages([{"content": head}, *messages], prefix_chars)
    return RequestInfo(model, stream, user if isinstance(user, str) else None, prefix)


def validate_embeddings(
    data: dict[str, Any], models: frozenset[str], prefix_chars: int
) -> RequestInfo:
    model, stream, user = common(data, models, ())
    if stream:
        raise InvalidRequest("embeddings are not streamed: 'stream' must be false", param="stream")
    given = data.get("input")
    if given is None:
        raise InvalidRequest("missing required parameter 'input'", param="input")
    if not isinstance(given, str | list) or not given:
        raise InvalidRequest("'input' must be a non-empty string or array", param="input")
    return RequestInfo(model, False, user, _prefix("", given, prefix_chars))


def _prefix(head: str, given: str | list[Any], limit: int) -> str:
    text = (
        given
        if isinstance(given, str)
        else orjson.dumps(given)[: 4 * limit].decode("utf-8", "ignore")
    )
    return (head + "\x1e" + text if head else text)[:limit]
