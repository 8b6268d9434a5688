"""OpenAI wire format for the simulated units test tool: request parsing and response bodies.

Everything here is deterministic (ids from x-request-id, a fixed `created`, token i is
always "tok{i} ") so that a stream fetched directly and one relayed by the gateway can be
compared byte for byte. A unit's `variant` setting swaps "tok" for a word drawn from the
variant and i, so units of one variant answer alike and another variant answers differently,
as two revisions of a model would; the text depends on the token's position, never on the
prompt, so a continuation still picks up exactly where the answer left off.

Token ids (`return_token_ids`, shaped like engine/server/wire.py) are deterministic too: a
prompt word is one id below 256, and answer token i is id `GEN_BASE + i`. So a token-id prompt
says how much of the answer already exists, and `/v1/completions` continues it exactly where
an uninterrupted answer would go on, which is what the gateway's mid-stream resumption sends.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

import orjson

from loadtest.simunits.params import ParamError, as_object, integer
from loadtest.simunits.toolcalls import Tool, ToolCall, parse_tool

Kind = Literal["chat", "completion"]

PROCESS_CREATED = int(time.time())
DONE_EVENT = b"data: [DONE]\n\n"
GEN_BASE = 1000
"""Id of answer token 0; prompt ids stay below it, so ids >= GEN_BASE are answer tokens."""
VARIANT_WORDS = (
    "amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor",
    "ivory", "juniper", "kelp", "lumen", "maple", "nectar", "onyx", "pine",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class GenRequest:
    kind: Kind
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    prompt: tuple[str | int, ...]
    """The prompt's words and token ids, in order; ids are only worked out when asked for."""
    start: int = 0
    """Answer tokens already in a token-id prompt: where this request's answer picks up."""
    return_token_ids: bool = False
    tool: Tool | None = None
    """The tool a chat answer calls (see toolcalls.py), if the request offers one."""

    @property
    def prompt_tokens(self) -> int:
        return max(1, len(self.prompt))

    def prompt_ids(self) -> list[int]:
        """One id per prompt word (below 256), token ids as given; an empty prompt is [0]."""
        ids = [part if isinstance(part, int) else _word_id(part) for part in self.prompt]
        return ids or [0]


def token_text(index: int, variant: str = "") -> str:
    if not variant:
        return f"tok{index} "
    word = VARIANT_WORDS[zlib.crc32(f"{variant}:{index}".encode()) % len(VARIANT_WORDS)]
    return f"{word}{index} "


def token_id(index: int) -> int:
    return GEN_BASE + index


def sse_event(payload: Mapping[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _words(text: object) -> list[str]:
    return text.split() if isinstance(text, str) else []


def _content_words(content: object) -> list[str]:
    if isinstance(content, list):
        return [
            w for part in content if isinstance(part, Mapping) for w in _words(part.get("text"))
        ]
    return _words(content)


def _word_id(word: str) -> int:
    return zlib.crc32(word.encode()) % 256


def _is_token_id(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _prompt_part(item: object) -> list[str] | list[int]:
    if isinstance(item, str):
        return item.split()
    if _is_token_id(item):
        return [item]
    if isinstance(item, list) and all(_is_token_id(t) for t in item):
        return item
    raise ParamError("prompt", "must be a string, strings, or token ids (integers >= 0)")


def _prompt(kind: Kind, body: Mapping[str, object]) -> tuple[tuple[str | int, ...], int]:
    """The prompt's words and token ids, and how many of the ids are answer tokens."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ParamError("messages", "is required and must be a list")
        words: list[str] = []
        for m in messages:
            if isinstance(m, Mapping):
                words += _content_words(m.get("content"))
        return tuple(words), 0
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return tuple(prompt.split()), 0
    if not isinstance(prompt, list):
        raise ParamError("prompt", "is required and must be a string or a list")
    parts = tuple(part for item in prompt for part in _prompt_part(item))
    return parts, sum(1 for part in parts if isinstance(part, int) and part >= GEN_BASE)


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
    return_token_ids = body.get("return_token_ids")
    if return_token_ids is not None and not isinstance(return_token_ids, bool):
        raise ParamError("return_token_ids", "must be a boolean")
    prompt, start = _prompt(kind, body)
    max_tokens = _max_tokens(kind, body)
    tool = parse_tool(body) if kind == "chat" else None
    ids = return_token_ids is True
    return GenRequest(kind, model, stream, include_usage, max_tokens, prompt, start, ids, tool)


def completion_length(req: GenRequest, default_tokens: int, cap: int) -> tuple[int, str]:
    """How many tokens to emit and the finish_reason that honestly describes why it stopped.

    The whole answer ends at `default_tokens` without max_tokens, else at `max_tokens` (at
    most `cap`), counted from the answer's first token: a continuation that starts at token
    `start` with the remaining max_tokens (or none, if the original had none) ends exactly
    where the uninterrupted answer does.
    """
    start = req.start
    if req.max_tokens is None:
        return max(0, default_tokens - start), "stop"
    count = max(0, min(req.max_tokens, cap - start))
    return count, "length" if count == req.max_tokens else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """As the builtin engine counts it; a simulated unit caches nothing."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


@dataclass(slots=True)
class Bodies:
    """Builds every body of one response, so all of its chunks share id, created and model.

    With `return_token_ids` the shapes are engine/server/wire.py's: the first chunk carries
    `prompt_token_ids` (chat: top level; completions: on its choice), every choice chunk
    but chat's role chunk carries `token_ids`, the generated ids it adds (`[]` on the finish).
    """

    req: GenRequest
    id: str
    created: int
    variant: str = ""
    _prompt_sent: bool = field(default=False, init=False)

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
        if self.req.return_token_ids and not self._prompt_sent:
            self._prompt_sent = True
            target = body if chat or choice is None else choice
            target["prompt_token_ids"] = self.req.prompt_ids()
        return body

    def _choice(
        self, delta: dict[str, object], finish: str | None, token_ids: Sequence[int] | None
    ) -> dict[str, object]:
        if self.req.kind == "completion":
            text = delta.get("content", "")
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if self.req.return_token_ids and token_ids is not None:
            choice["token_ids"] = list(token_ids)
        return choice

    def role_chunk(self) -> dict[str, object]:
        return self._chunk(self._choice({"role": "assistant", "content": ""}, None, None))

    def token_chunk(self, index: int) -> dict[str, object]:
        """The chunk of answer token `index`, counted from the answer's first token."""
        delta: dict[str, object] = {"content": token_text(index, self.variant)}
        return self._chunk(self._choice(delta, None, [token_id(index)]))

    def tool_call_chunk(self, call: ToolCall, index: int) -> dict[str, object]:
        """The chunk of token `index` of a tool-call answer (see ToolCall.delta)."""
        return self._chunk(self._choice(call.delta(index), None, [token_id(index)]))

    def finish_chunk(self, finish_reason: str) -> dict[str, object]:
        return self._chunk(self._choice({}, finish_reason, []))

    def usage_chunk(self, completion_tokens: int) -> dict[str, object]:
        body = self._chunk(None)
        body["usage"] = usage(self.req.prompt_tokens, completion_tokens)
        return body

    def _message(self, text: str, call: ToolCall | None, tokens: int) -> dict[str, object]:
        if call is None:
            return {"role": "assistant", "content": text}
        return {"role": "assistant", "content": None, "tool_calls": [call.message_call(tokens)]}

    def full(
        self, completion_tokens: int, finish_reason: str, call: ToolCall | None = None
    ) -> dict[str, object]:
        """The whole answer; with `call`, a chat answer is that tool call instead of text."""
        indices = range(self.req.start, self.req.start + completion_tokens)
        text = "".join(token_text(i, self.variant) for i in indices)
        chat = self.req.kind == "chat"
        body = self._base("chat.completion" if chat else "text_completion")
        if chat:
            body["system_fingerprint"] = None
            content: dict[str, object] = {"message": self._message(text, call, completion_tokens)}
        else:
            content = {"text": text}
        choice = {"index": 0, **content, "logprobs": None, "finish_reason": finish_reason}
        if self.req.return_token_ids:
            (body if chat else choice)["prompt_token_ids"] = self.req.prompt_ids()
            choice["token_ids"] = [token_id(i) for i in indices]
        body["choices"] = [choice]
        body["usage"] = usage(self.req.prompt_tokens, completion_tokens)
        return body
