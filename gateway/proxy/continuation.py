"""Which streams can be resumed on another unit, and the request that continues them.

A broken stream is continued as a plain completion of `prompt ids + generated ids`: the
leader's own prompt ids already hold the rendered chat template, so the new unit continues
the very token sequence the first one was producing. With greedy decoding the client's text is
then identical to an uninterrupted answer.

What cannot be continued that way is excluded up front (the stream is relayed as before):
several choices, logprobs (the new unit would score a different prefix), tool calls and
structured output (the grammar's state and the tool-call parser live in the first unit; a
continuation would start the grammar over at the generated prefix), presence and frequency
penalties (they count generated tokens, which the continuation sees as prompt), echo,
suffix and prompt embeddings. The gateway does not validate these fields (the unit does), so
what a continuation would read must be plain: a stream whose `n` or output budget is anything
but an integer (or null) is relayed without resumption. Only the sampling fields a completion
understands travel to the continuation: a chat-only field could be refused by the completions
endpoint mid-answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.proxy.jsonbody import dumps, first_member, loads_exact

# Fields whose presence (with a truthy value) rules resumption out; see the module docstring.
_EXCLUDED = frozenset(
    (
        "tools",
        "functions",
        "response_format",
        "logprobs",
        "top_logprobs",
        "echo",
        "suffix",
        "best_of",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
        "presence_penalty",
        "frequency_penalty",
        "prompt_embeds",
    )
)

# Sampling fields copied to the continuation unchanged (`min_tokens` is adjusted).
_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "repetition_penalty",
    "logit_bias",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "user",
)

# The output budget's fields: the first of these two that is set bounds it (max_new_tokens),
# and min_tokens is carried over less what was already generated (continuation).
_MAX_TOKENS = ("max_completion_tokens", "max_tokens")
_BUDGET = (*_MAX_TOKENS, "min_tokens")
_INTEGERS = frozenset(("n", *_BUDGET))  # a continuation computes with them
_CARRIED = (*_SAMPLING, *_BUDGET)

# OpenAI's (and the builtin engine's, and vLLM's) default for /v1/completions.
COMPLETION_DEFAULT_MAX_TOKENS = 16


def resumable(data: dict[str, Any], chat: bool) -> bool:
    """True when a broken stream of this request can be continued token-exactly."""
    if data.get("stream") is not True or data.get("n") not in (None, 1):  # null: n = 1
        return False
    # Only the fields the request has are looked at (most have none of them).
    for name in _INTEGERS.intersection(data):
        if not _plain_int(data[name]):
            return False
    for name in _EXCLUDED.intersection(data):
        if data[name]:
            return False
    if chat:
        return True
    prompt = data.get("prompt")
    return isinstance(prompt, str) or (
        isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    )


def with_token_ids(data: dict[str, Any]) -> bytes:
    """The body to send the first unit: the client's, asking for token ids as well."""
    return dumps({**data, "return_token_ids": True})


def asking_token_ids(body: bytes, data: dict[str, Any]) -> bytes:
    """`with_token_ids` of the client's own bytes (`data` parsed from them): the member spliced
    in, the rest byte for byte; rewritten only if the client set it to anything but true."""
    if "return_token_ids" not in data:
        return first_member(body, b'"return_token_ids":true')
    if data["return_token_ids"] is True:
        return body
    exact = loads_exact(body)
    assert isinstance(exact, dict)  # intake only lets JSON objects through
    return with_token_ids(exact)


def asking_usage(send: bytes, data: dict[str, Any]) -> bytes:
    """`send` (the body for the unit, the client's as `data` parsed it, maybe asking for
    token ids) asking for the stream's usage chunk as well, which carries the prompt tokens
    the unit's cache held. For a client that did not ask: the tracker reads it and drops it."""
    options = data.get("stream_options")
    if "stream_options" not in data:
        return first_member(send, b'"stream_options":{"include_usage":true}')
    exact = loads_exact(send)
    assert isinstance(exact, dict)  # intake only lets JSON objects through
    mine = options if isinstance(options, dict) else {}
    return dumps({**exact, "stream_options": {**mine, "include_usage": True}})


def _plain_int(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def carried(data: dict[str, Any]) -> dict[str, Any]:
    """What a continuation takes from the client's request: its sampling fields and output
    budget. A resumable stream keeps this, not the request: the messages or prompt (most of
    a request) travel as the leader's prompt ids, so keeping them would double a long
    prompt's memory for the stream's whole life."""
    return {name: data[name] for name in _CARRIED if name in data}


def carried_exactly(body: bytes, data: dict[str, Any]) -> dict[str, Any]:
    """`carried(data)`, read again from `body` if orjson made an integer beyond 64 bits of
    one of its fields a float (the continuation sends the client's integer, not a float)."""
    kept = carried(data)
    if not _lost_integer(kept):
        return kept
    exact = loads_exact(body)
    assert isinstance(exact, dict)  # intake only lets JSON objects through
    return carried(exact)


def _lost_integer(value: Any, depth: int = 2) -> bool:
    """A float that was an integer beyond 64 bits in `value` or its items (down to `depth`:
    the carried fields hold numbers or arrays and objects of them)."""
    if isinstance(value, float):
        return value.is_integer() and abs(value) >= 2**63
    if isinstance(value, dict):
        items: Iterable[Any] = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return False
    if depth > 0:
        for v in items:  # (a loop, no call for the integers and strings most fields hold)
            if isinstance(v, float | dict | list) and _lost_integer(v, depth - 1):
                return True
    return False


def max_new_tokens(data: dict[str, Any], chat: bool) -> int | None:
    """The request's output budget, None when it is the model's remaining context."""
    for name in _MAX_TOKENS:
        value = data.get(name)
        if isinstance(value, int):
            return value
    return None if chat else COMPLETION_DEFAULT_MAX_TOKENS


def continuation(
    data: dict[str, Any], model: str, prompt: list[int], remaining: int | None, done: int
) -> bytes:
    """A streamed /v1/completions request continuing after `done` committed tokens."""
    body: dict[str, Any] = {"model": model, "prompt": prompt}
    for name in _SAMPLING:
        if name in data:
            body[name] = data[name]
    min_tokens = data.get("min_tokens")
    if isinstance(min_tokens, int) and min_tokens > done:
        body["min_tokens"] = min_tokens - done
    if remaining is not None:
        body["max_tokens"] = remaining
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    body["return_token_ids"] = True
    return dumps(body)
