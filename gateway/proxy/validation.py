"""Request validation: malformed requests are answered 4xx here and never reach a unit.

The checks cover what would make a unit fail or misbehave (types, required fields, ranges),
not every OpenAI parameter: unknown fields are passed through for the engine to judge. The body
is forwarded as received; parsing here only decides and extracts the routing keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the router needs from a valid body."""

    model: str
    stream: bool
    user: str | None
    prefix: str


def parse_body(body: bytes) -> dict[str, Any]:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {_kind(data)}")
    return data


def validate_chat(data: dict[str, Any], models: frozenset[str], prefix_chars: int) -> RequestInfo:
    model, stream, user = common(data, models)
    messages = _required(data, "messages", list, "an array")
    if not messages:
        raise InvalidRequest("'messages' must not be empty", param="messages")
    for i, message in enumerate(messages):
        _check_message(message, f"messages[{i}]")
    return RequestInfo(model, stream, user, prefix_of_messages(messages, prefix_chars))


def validate_completion(
    data: dict[str, Any], models: frozenset[str], prefix_chars: int
) -> RequestInfo:
    model, stream, user = common(data, models)
    prompt = data.get("prompt")
    if prompt is None:
        raise InvalidRequest("missing required parameter 'prompt'", param="prompt")
    if not _valid_prompt(prompt):
        raise InvalidRequest(
            "'prompt' must be a string, an array of strings, an array of token ids or an array "
            "of token id arrays, and not empty",
            param="prompt",
        )
    # Arrays are keyed by their JSON text's first characters. A byte slice can end inside a
    # multi-byte character; the first `prefix_chars` characters fit in 4 bytes each, so only a
    # cut character past them is dropped.
    prefix = (
        prompt[:prefix_chars]
        if isinstance(prompt, str)
        else orjson.dumps(prompt)[: 4 * prefix_chars].decode("utf-8", "ignore")[:prefix_chars]
    )
    return RequestInfo(model, stream, user, prefix)


def common(
    data: dict[str, Any],
    models: frozenset[str],
    budgets: tuple[str, ...] = ("max_tokens", "max_completion_tokens", "n"),
) -> tuple[str, bool, str | None]:
    """The fields every routed API shares: model (served here), stream, sampling, user;
    `budgets` are the integer fields that must be >= 1."""
    model = _required(data, "model", str, "a string")
    if model not in models:
        raise InvalidRequest(
            f"The model '{model}' does not exist; served models: {sorted(models)}",
            status=404,
            code="model_not_found",
            param="model",
        )
    stream = _optional(data, "stream", bool, "a boolean")
    _optional(data, "stream_options", dict, "an object")
    for name in budgets:
        value = _optional(data, name, int, "an integer")
        if value is not None and value < 1:
            raise InvalidRequest(f"'{name}' must be >= 1, got {value}", param=name)
    _number_in(data, "temperature", 0.0, 2.0)
    _number_in(data, "top_p", 0.0, 1.0)
    _optional(data, "seed", int, "an integer")
    stop = data.get("stop")
    if stop is not None and not (isinstance(stop, str) or _list_of(stop, str)):
        raise InvalidRequest("'stop' must be a string or an array of strings", param="stop")
    user = _optional(data, "user", str, "a string")
    return model, bool(stream), user


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise InvalidRequest(f"'{where}' must be an object, got {_kind(message)}", param=where)
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidRequest(
            f"'{where}.role' must be one of {sorted(ROLES)}", param=f"{where}.role"
        )
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise InvalidRequest(
            f"'{where}.content' must be a string or an array of parts, got {_kind(content)}",
            param=f"{where}.content",
        )
    if content is None and role in ("system", "developer", "user"):
        raise InvalidRequest(
            f"'{where}.content' is required for role '{role}'", param=f"{where}.content"
        )


def prefix_of_messages(messages: list[dict[str, Any]], limit: int) -> str:
    parts: list[str] = []
    size = 0
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        parts.append(text)
        size += len(text)
        if size >= limit:
            break
    return "\x1e".join(parts)[:limit]


def _valid_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    return _list_of(prompt, str) or _token_ids(prompt) or all(_token_ids(p) and p for p in prompt)


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    )


def _list_of(value: Any, kind: type) -> bool:
    return isinstance(value, list) and all(isinstance(v, kind) for v in value)


def _required(data: dict[str, Any], name: str, kind: type, what: str) -> Any:
    if name not in data or data[name] is None:
        raise InvalidRequest(f"missing required parameter '{name}'", param=name)
    return _optional(data, name, kind, what)


def _optional(data: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidRequest(f"'{name}' must be {what}, got {_kind(value)}", param=name)
    return value


def _number_in(data: dict[str, Any], name: str, low: float, high: float) -> None:
    value = data.get(name)
    if value is None:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high:
        raise InvalidRequest(
            f"'{name}' must be a number in [{low:g}, {high:g}], got {value!r}", param=name
        )


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )
