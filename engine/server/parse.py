"""OpenAI request bodies -> prompt ids and SamplingParams, or a 400 naming the parameter.

The gateway validates too, but the leader is also reached directly (load tools, tests, another
gateway version), so it checks everything it relies on. Which fields are honoured, accepted
without effect or refused is decided in `fields.py`; nothing is dropped in silence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from engine.api import Engine
from engine.model.tokenizer import Tokenizer
from engine.scheduler import InvalidParams, SamplingParams
from engine.server.errors import JSON, ApiError, bad
from engine.server.fields import (
    CHAT,
    COMPLETION,
    MESSAGE,
    STREAM_OPTIONS,
    TEXT_PART,
    check_fields,
)

Kind = Literal["chat", "completion"]

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy default; chat defaults to the rest of context


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    kind: Kind
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"


def parse_request(kind: Kind, raw: bytes, engine: Engine) -> ParsedRequest:
    data = _load(raw)
    _check_model(data, engine.model_name)
    check_fields(data, CHAT if kind == "chat" else COMPLETION)
    _check_n(data)
    tokenizer = engine.tokenizer
    ids = _chat_prompt(data, tokenizer) if kind == "chat" else _completion_prompt(data, tokenizer)
    param = "messages" if kind == "chat" else "prompt"
    _check_length(ids, engine.max_seq_len, param)
    room = engine.max_seq_len - len(ids)
    default_max = room if kind == "chat" else min(room, COMPLETION_DEFAULT_MAX_TOKENS)
    options = _get(data, "stream_options", dict, "an object") or {}
    check_fields(options, STREAM_OPTIONS, "stream_options")
    return ParsedRequest(
        kind=kind,
        prompt_ids=tuple(ids),
        params=_sampling(data, default_max),
        stream=bool(_get(data, "stream", bool, "a boolean")),
        include_usage=bool(_get(options, "include_usage", bool, "a boolean", "stream_options")),
        return_token_ids=bool(_get(data, "return_token_ids", bool, "a boolean")),
    )


def _load(raw: bytes) -> JSON:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad(f"request body is not valid JSON: {exc}", None) from None
    if not isinstance(data, dict):
        raise bad("request body must be a JSON object", None)
    return data


def _check_model(data: JSON, served: str) -> None:
    model = _get(data, "model", str, "a string")
    if model is None:
        raise bad("missing required parameter 'model'", "model")
    if model != served:
        message = f"The model '{model}' does not exist; this unit serves '{served}'"
        raise ApiError(404, message, param="model", code="model_not_found")


def _check_n(data: JSON) -> None:
    n = _get(data, "n", int, "an integer")
    if n is not None and n != 1:
        raise bad(f"'n' must be 1 (one choice per request), got {n}", "n")


def _chat_prompt(data: JSON, tokenizer: Tokenizer) -> list[int]:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' is required and must be a non-empty array", "messages")
    conversation = [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    try:
        return tokenizer.apply_chat_template(conversation)
    except ValueError as exc:
        raise bad(f"'messages' cannot be rendered: {exc}", "messages") from None


def _message(message: Any, where: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise bad(f"'{where}' must be an object", where)
    role = message.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        param = f"{where}.role"
        raise bad(f"'{param}' must be one of {sorted(CHAT_ROLES)}, got {role!r}", param)
    check_fields(message, MESSAGE, where)
    return {"role": CHAT_ROLES[role], "content": _content(message.get("content"), where)}


def _content(content: Any, where: str) -> str:
    """A string, or text parts joined by newlines (as vLLM does). Other parts are refused by
    type: an image or a sound the model never sees would change the answer."""
    param = f"{where}.content"
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{param}' must be a string or an array of text parts", param)
    return "\n".join(_text(part, f"{param}[{i}]", param) for i, part in enumerate(content))


def _text(part: Any, where: str, param: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind != "text":
        what = f"a part of type {kind!r}" if isinstance(kind, str) else "not a text part"
        raise bad(f"'{where}' is {what}; this engine reads text parts only", param)
    check_fields(part, TEXT_PART, where)
    text = part.get("text")
    if not isinstance(text, str):
        raise bad(f"'{where}.text' must be a string", param)
    return text


def _completion_prompt(data: JSON, tokenizer: Tokenizer) -> list[int]:
    """A string (encoded with BOS, like vLLM) or token ids used as-is for exact resumption."""
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > 1:
            message = "batched prompts are not supported: send one prompt per request"
            raise bad(message, "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_bos=True)
    elif isinstance(prompt, list):
        # Bounded by the engine, which knows the model's vocabulary: a model may emit ids past
        # the tokenizer's (padded embeddings), and a resumed stream sends them back as prompt.
        ids = _token_ids(prompt, 2**63, "prompt")
    else:
        raise bad("'prompt' is required: a string or an array of token ids", "prompt")
    if not ids:
        raise bad("'prompt' must not be empty", "prompt")
    return ids


def _token_ids(value: list[Any], vocab_size: int, param: str) -> list[int]:
    for token in value:
        if not isinstance(token, int) or isinstance(token, bool):
            raise bad(f"'{param}' must contain only integer token ids, got {token!r}", param)
        if not 0 <= token < vocab_size:
            raise bad(f"'{param}': token id {token} is outside [0, {vocab_size})", param)
    return list(value)


def _check_length(ids: list[int], max_seq_len: int, param: str) -> None:
    if len(ids) >= max_seq_len:
        message = (
            f"This model's maximum context length is {max_seq_len} tokens; the prompt has "
            f"{len(ids)} tokens, leaving no room for a completion"
        )
        raise bad(message, param, "context_length_exceeded")


def _sampling(data: JSON, default_max: int) -> SamplingParams:
    fields: JSON = {
        "max_tokens": _max_tokens(data, default_max),
        "temperature": _number(data, "temperature", 0.0, 2.0),
        "top_p": _number(data, "top_p", 0.0, 1.0),
        "seed": _get(data, "seed", int, "an integer"),
        "stop": _stop(data),
        "stop_token_ids": _stop_token_ids(data),
        "ignore_eos": _get(data, "ignore_eos", bool, "a boolean"),
    }
    try:
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    except InvalidParams as exc:
        raise bad(f"'{exc.field}' {exc.problem}, got {exc.value!r}", exc.field) from None


def _max_tokens(data: JSON, default: int) -> int:
    """max_completion_tokens (the current name) wins over max_tokens (the deprecated one)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = _get(data, name, int, "an integer")
        if value is not None:
            if value < 1:
                raise bad(f"'{name}' must be >= 1, got {value}", name)
            return int(value)
    return default


def _number(data: JSON, name: str, low: float, high: float) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high:
        raise bad(f"'{name}' must be a number in [{low:g}, {high:g}], got {value!r}", name)
    return float(value)


def _stop(data: JSON) -> tuple[str, ...] | None:
    stop = data.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad("'stop' must be a non-empty string or an array of non-empty strings", "stop")
    return tuple(stop)


def _stop_token_ids(data: JSON) -> tuple[int, ...] | None:
    value = _get(data, "stop_token_ids", list, "an array of token ids")
    return None if value is None else tuple(_token_ids(value, 2**63, "stop_token_ids"))


def _get(data: JSON, name: str, kind: type, what: str, parent: str | None = None) -> Any:
    """The field, None when absent or null; a bool is not accepted where an int is meant."""
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        param = f"{parent}.{name}" if parent else name
        raise bad(f"'{param}' must be {what}, got {type(value).__name__}", param)
    return value
