"""Request validation: only what the gateway itself reads is checked here.

The gateway reads a body for the model it routes by, the `stream` flag, the session and prompt
prefix affinity keys are made of, and what resumption and admission read (their own checks:
continuation.py, priority.py). Every other field, and whether the request makes sense, is the
unit's to judge: a stock vLLM's own 400s come back byte for byte, and this project's engine
refuses by name what it does not honour. So a unit gets whatever it would accept directly. The
body is forwarded as received (intake.py splices in a model the client left out); parsing here
only decides and extracts the routing keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.proxy.jsonbody import dumps


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the router needs from a valid body."""

    model: str
    stream: bool
    user: str | None
    prefix: str


@dataclass(frozen=True, slots=True)
class Served:
    """The models the gateway serves, and the one a request without `model` goes to (None:
    a request must name its model)."""

    names: frozenset[str]
    default: str | None = None

    @classmethod
    def of(cls, models: Sequence[str], default: str = "") -> Served:
        """`[gateway].models` and `default_model`: the default, else the only model."""
        only = models[0] if len(models) == 1 else None
        return cls(frozenset(models), default or only)


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


def validate_chat(data: dict[str, Any], served: Served, prefix_chars: int) -> RequestInfo:
    model, stream, user = common(data, served)
    return RequestInfo(model, stream, user, prefix_of_messages(data.get("messages"), prefix_chars))


def validate_completion(data: dict[str, Any], served: Served, prefix_chars: int) -> RequestInfo:
    model, stream, user = common(data, served)
    prompt = data.get("prompt")  # none with `prompt_embeds`
    return RequestInfo(model, stream, user, text_prefix(prompt, prefix_chars))


def common(
    data: dict[str, Any], served: Served, *, model_required: bool = False
) -> tuple[str, bool, str | None]:
    """What every routed API shares: the model (served here), the stream flag, the user."""
    model = model_of(data, served, model_required)
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest(f"'stream' must be a boolean, got {_kind(stream)}", param="stream")
    return model, bool(stream), user_of(data)


def model_of(data: dict[str, Any], served: Served, required: bool = False) -> str:
    """The model to route by. Left out (or null, or "", which vLLM reads as left out) where
    the API allows it: `served.default`."""
    model = data.get("model")
    if model is None or model == "":
        if required or served.default is None:
            raise InvalidRequest(
                f"missing required parameter 'model'; served models: {sorted(served.names)}",
                param="model",
            )
        return served.default
    if not isinstance(model, str):
        raise InvalidRequest(f"'model' must be a string, got {_kind(model)}", param="model")
    if model not in served.names:
        raise InvalidRequest(
            f"The model '{model}' does not exist; served models: {sorted(served.names)}",
            status=404,
            code="model_not_found",
            param="model",
        )
    return model


def user_of(data: dict[str, Any]) -> str | None:
    """The `user` field when it can key a session (else the unit judges it)."""
    user = data.get("user")
    return user if isinstance(user, str) else None


def prefix_of_messages(messages: Any, limit: int) -> str:
    """The first `limit` characters of the messages' contents (a part array as its JSON)."""
    if not isinstance(messages, list):
        return ""
    parts: list[str] = []
    size = 0
    for message in messages:
        if not isinstance(message, dict):
            continue  # the unit's to refuse
        content = message.get("content")
        text = content if isinstance(content, str) else json_prefix(content, limit)
        parts.append(text)
        size += len(text)
        if size >= limit:
            break
    return "\x1e".join(parts)[:limit]


def text_prefix(value: Any, limit: int) -> str:
    """The first `limit` characters of a prompt or input: a string's own, else its JSON's
    ("" for none)."""
    if isinstance(value, str):
        return value[:limit]
    return "" if value is None else json_prefix(value, limit)


def json_prefix(value: Any, limit: int) -> str:
    """The first `limit` characters of `value`'s JSON text. A byte slice can end inside a
    multi-byte character; the first `limit` characters fit in 4 bytes each, so only a cut
    character past them is dropped."""
    return _json_text(value)[: 4 * limit].decode("utf-8", "ignore")[:limit]


def _json_text(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits, or nesting past 254
        try:
            return dumps(value)
        except RecursionError:  # too deep for any writer: no prefix, no key
            return b""


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )
