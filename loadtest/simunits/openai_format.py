"""OpenAI wire format for the simulated units test tool: request parsing and response bodies.

Everything here is deterministic (ids from x-request-id, a fixed `created`, token i is
always "tok{i} ") so that a stream fetched directly and one relayed by the gateway can be
compared byte for byte.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import orjson

from loadtest.simunits.params import ParamError, as_object, integer

Kind = Literal["chat", "completion"]

PROCESS_CREATED = int(time.time())
DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class GenRequest:
    kind: Kind
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    prompt_tokens: int


def token_text(index: int) -> str:
    return f"tok{index} "


def sse_event(payload: Mapping[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _words(text: object) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def _content_words(content: object) -> int:
    if isinstance(content, list):
        return sum(_words(part.get("text")) for part in content if isinstance(part, Mapping))
    return _words(content)


def _prompt_words(kind: Kind, body: Mapping[str, object]) -> int:
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ParamError("messages", "is required and must be a list")
        return sum(_content_words(m.get("content")) for m in messages if isinstance(m, Mapping))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return _words(prompt)
    if not isinstance(prompt, list):
        raise ParamError("prompt", "is required and must be a string or a list")
    # Token-id prompts count one per id; lists of strings count words.
    return sum(
        _words(p) if isinstance(p, str) else len(p) if isinstance(p, list) else 1 for p in prompt
    )


def _max_tokens(kind: Kind, body: Mapping[str, object]) -> int | None:
    key = (
        "max_completion_tokens"
        if kind == "chat" and "max_completion_tokens" in body
        else "max_tokens"
    )
    if body.get(key) is None:
        return None
    return integer(body, key, 1, 1)


def parse_request(kind: Kind, raw: object, served_model: str) -> GenRequest:
    body = as_object(raw)
    model = body.get("model", served_model)
    if not isinstance(model, str):
        raise ParamError("model", "must be a string")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ParamError("stream", "must be a boolean")
    options = body.get("stream_options")
    include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
    prompt_tokens = max(1, _prompt_words(kind, body))
    return GenRequest(kind, model, stream, include_usage, _max_tokens(kind, body), prompt_tokens)


def completion_length(req: GenRequest, default_tokens: int, cap: int) -> tuple[int, str]:
    """How many tokens to emit and the finish_reason that honestly describes why it stopped."""
    if req.max_tokens is None:
        return default_tokens, "stop"
    count = min(req.max_tokens, cap)
    return count, "length" if count == req.max_tokens else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True, slots=True)
class Bodies:
    """Builds every body of one response, so all of its chunks share id, created and model."""

    req: GenRequest
    id: str
    created: int

    def _base(self, object_name: str) -> dict[str, object]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.req.model,
        }

    def _chunk(self, choice: dict[str, object] | None) -> dict[str, object]:
        chat = self.req.kind == "chat"
        body = self._base("chat.completion.chunk" if chat else "text_completion")
        if chat:
            body["system_fingerprint"] = None
        body["choices"] = [] if choice is None else [choice]
        if self.req.include_usage:
            # OpenAI sends "usage": null on every chunk before the usage chunk.
            body["usage"] = None
        return body

    def _choice(self, delta: dict[str, object], finish: str | None) -> dict[str, object]:
        if self.req.kind == "completion":
            text = delta.get("content", "")
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def role_chunk(self) -> dict[str, object]:
        return self._chunk(self._choice({"role": "assistant", "content": ""}, None))

    def token_chunk(self, index: int) -> dict[str, object]:
        return self._chunk(self._choice({"content": token_text(index)}, None))

    def finish_chunk(self, finish_reason: str) -> dict[str, object]:
        return self._chunk(self._choice({}, finish_reason))

    def usage_chunk(self, completion_tokens: int) -> dict[str, object]:
        body = self._chunk(None)
        body["usage"] = usage(self.req.prompt_tokens, completion_tokens)
        return body

    def full(self, completion_tokens: int, finish_reason: str) -> dict[str, object]:
        text = "".join(token_text(i) for i in range(completion_tokens))
        chat = self.req.kind == "chat"
        body = self._base("chat.completion" if chat else "text_completion")
        if chat:
            body["system_fingerprint"] = None
            content: dict[str, object] = {"message": {"role": "assistant", "content": text}}
        else:
            content = {"text": text}
        choice = {"index": 0, **content, "logprobs": None, "finish_reason": finish_reason}
        body["choices"] = [choice]
        body["usage"] = usage(self.req.prompt_tokens, completion_tokens)
        return body
