"""Token usage as a unit reports it, read from its answer's own events.

Every API says it in its own words: chat, completions and embeddings `usage.prompt_tokens` /
`completion_tokens` (a stream's last chunk, when asked for); the Responses API
`usage.input_tokens` / `output_tokens` (in `response.completed`); Anthropic's Messages API
`usage.input_tokens` in `message_start` and the running `output_tokens` in `message_delta`.
A stream is scanned as it is relayed: a read with no `"usage"` in it, ending on an event
boundary, costs one byte search; only an event that names a usage is parsed (OpenAI sends
`"usage": null` on every chunk before the last when usage is asked for: those are not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.relay.sse import TOO_LONG, EventSplitter, data_of

_USAGE = b'"usage"'
_NULL_USAGE = re.compile(rb'"usage"[ \t\r\n]*:[ \t\r\n]*null')


def says_usage(event: bytes) -> bool:
    """Whether `event` names a usage that is not null (the native relay's `says_usage`)."""
    named = event.count(_USAGE)
    return named > 0 and named != len(_NULL_USAGE.findall(event))


@dataclass(frozen=True, slots=True)
class Usage:
    prompt: int
    completion: int
    # Of the prompt's tokens, those the unit's prefix cache held, where it says
    # (`prompt_tokens_details.cached_tokens`: vLLM with --enable-prompt-tokens-details).
    cached: int | None = None


def of_body(body: bytes) -> Usage | None:
    """A whole (non-streamed) answer's usage, None when it reports none."""
    if _USAGE not in body:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _usage(doc) if isinstance(doc, dict) else None


class UsageReader:
    """One streamed answer's usage, from the events that carry it (the last one wins)."""

    __slots__ = ("cached", "completion", "error", "prompt", "splitter")

    def __init__(self) -> None:
        self.splitter = EventSplitter()
        self.error: str | None = None  # set when an event grows past MAX_EVENT
        self.prompt: int | None = None
        self.completion: int | None = None
        self.cached: int | None = None

    @property
    def usage(self) -> Usage | None:
        if self.prompt is None and self.completion is None:
            return None
        return Usage(self.prompt or 0, self.completion or 0, self.cached)

    def feed(self, data: bytes) -> None:
        if not self.splitter.pending and _USAGE not in data and data.endswith(b"\n\n"):
            return  # whole events, none of them about usage
        for event in self.splitter.feed(data):
            if says_usage(event):
                self._event(event)
        if self.splitter.overflowed():
            self.error = TOO_LONG

    def _event(self, event: bytes) -> None:
        payload = data_of(event)
        try:
            doc = orjson.loads(payload) if payload is not None else None
        except orjson.JSONDecodeError:
            return
        if not isinstance(doc, dict):
            return
        found = _usage(doc)
        if found is None:
            return
        if found.prompt or self.prompt is None:
            self.prompt = found.prompt
        if found.completion or self.completion is None:
            self.completion = found.completion
        if found.cached is not None:
            self.cached = found.cached


def _usage(doc: dict[str, Any]) -> Usage | None:
    usage = doc.get("usage")
    for holder in ("response", "message"):  # Responses' and Messages' events nest it
        inner = doc.get(holder)
        if not isinstance(usage, dict) and isinstance(inner, dict):
            usage = inner.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    return Usage(prompt, completion, cached_of(usage))


def cached_of(usage: dict[str, Any]) -> int | None:
    """The prompt tokens a usage says were cached (chat and completions' details, or the
    Responses API's), None where it does not say."""
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
    if not isinstance(details, dict):
        return None
    cached = details.get("cached_tokens")
    return cached if type(cached) is int else None


def _int(value: object) -> int:
    return value if type(value) is int else 0
