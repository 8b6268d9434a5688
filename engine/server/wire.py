"""OpenAI response bodies: chat.completion(.chunk) and text_completion, plus SSE framing.

The gateway relays these bytes untouched and the official `openai` client parses them, so the
shapes follow OpenAI exactly (`usage: null` on chunks before the usage chunk when usage was
asked for; a separate finish chunk with an empty delta). `return_token_ids` follows vLLM: chat
puts `prompt_token_ids` at the top level (first chunk / the response), completions put it on
the choice; every choice carries `token_ids`, the generated ids it adds.

With n choices every chunk carries one choice, told apart by `index`; usage counts the prompt
once and the completion tokens of all choices. Logprobs follow OpenAI's two shapes (chat:
`logprobs.content` entries; completions: parallel `tokens`/`token_logprobs`/`top_logprobs`/
`text_offset` arrays). Tool calls are parsed from each choice's text (`engine/tools`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from engine.api import TokenEvent
from engine.server.errors import JSON
from engine.server.parse import ParsedRequest
from engine.tools import CallDelta, Delta, ToolStream, finish_reason, parse_complete

DONE = b"data: [DONE]\n\n"
TokenBytes = Callable[[int], bytes]


def sse(payload: JSON) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


@dataclass(slots=True)
class ChoiceState:
    """What one choice has produced so far (text, ids and logprobs kept for whole answers
    only: a stream sends each as it comes)."""

    index: int
    texts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenEvent] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    parser: ToolStream | None = None
    text_len: int = 0  # characters of text so far: the completions text_offset


@dataclass(slots=True)
class Bodies:
    """Every body of one response, so all its chunks share id, created and model."""

    req: ParsedRequest
    id: str
    created: int
    model: str
    token_bytes: TokenBytes
    choices: list[ChoiceState] = field(init=False)
    prompt_tokens: int = field(default=0, init=False)
    cached_tokens: int = field(default=0, init=False)
    _prompt_sent: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.prompt_tokens = len(self.req.prompt_ids)
        tools = self.req.tools
        self.choices = [
            ChoiceState(i, parser=None if tools is None else ToolStream(tools.names))
            for i in range(self.req.n)
        ]

    @property
    def chat(self) -> bool:
        return self.req.kind == "chat"

    # -- streams --

    def opening(self) -> list[JSON]:
        """Chat announces the assistant role of each choice before any token."""
        if not self.chat:
            return []
        return [
            self._chunk(
                _with_finish(
                    {"index": c.index, "delta": {"role": "assistant", "content": ""}}, None
                )
            )
            for c in self.choices
        ]

    def chunks(self, event: TokenEvent) -> list[JSON]:
        """The chunks one engine event makes: its text (or bare token), then the finish."""
        choice = self._record(event, whole=False)
        ids = [] if event.token_id is None else [event.token_id]
        out: list[JSON] = []
        logprobs = (
            self._logprobs([event], choice.text_len - len(event.text))
            if (self.req.logprobs is not None and event.token_id is not None)
            else None
        )
        if choice.parser is not None:
            deltas = choice.parser.feed(event.text)
            if event.finished:
                deltas += choice.parser.finish()
            out += [self._delta_chunk(choice.index, _delta(d)) for d in deltas]
            if logprobs is not None or (self.req.return_token_ids and ids):
                if out:
                    self._attach(out[-1], logprobs, ids)
                else:
                    out.append(self._text_chunk(choice.index, "", ids, logprobs))
        elif event.text or logprobs is not None or (self.req.return_token_ids and ids):
            out.append(self._text_chunk(choice.index, event.text, ids, logprobs))
        if event.finished:
            calls = 0 if choice.parser is None else len(choice.parser.calls)
            reason = self._finish_reason(choice, calls)
            out.append(self._chunk(self._choice(choice.index, None, [], reason)))
        return out

    def usage_chunk(self) -> JSON:
        body = self._chunk(None)
        body["usage"] = self.usage()
        return body

    # -- whole answers --

    def record(self, event: TokenEvent) -> None:
        self._record(event, whole=True)

    def full(self) -> JSON:
        body = self._base("")
        if self.req.return_token_ids and self.chat:  # before the choices, as vLLM orders it
            body["prompt_token_ids"] = list(self.req.prompt_ids)
        body["choices"] = [self._full_choice(c) for c in self.choices]
        body["usage"] = self.usage()
        return body

    def usage(self) -> JSON:
        completion = sum(c.completion_tokens for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    # -- internals --

    def _record(self, event: TokenEvent, whole: bool) -> ChoiceState:
        """Count the event into its choice; a whole answer also keeps its text, ids and
        logprobs (a stream has sent them already)."""
        choice = self.choices[event.index]
        choice.text_len += len(event.text)
        self.cached_tokens = max(self.cached_tokens, event.cached_tokens)
        if whole:
            choice.texts.append(event.text)
            if event.token_id is not None:
                choice.token_ids.append(event.token_id)
                if self.req.logprobs is not None:
                    choice.logprobs.append(event)
        choice.completion_tokens = event.completion_tokens
        if event.finished:
            choice.finish_reason = event.finish_reason
        return choice

    @staticmethod
    def _finish_reason(choice: ChoiceState, calls: int) -> str | None:
        reason = choice.finish_reason
        return reason if reason is None else finish_reason(reason, calls)

    def _full_choice(self, choice: ChoiceState) -> JSON:
        text = "".join(choice.texts)
        out: JSON = {"index": choice.index}
        calls = 0
        if self.chat:
            message: JSON = {"role": "assistant", "content": text}
            if self.req.tools is not None:
                content, parsed = parse_complete(text, self.req.tools.names)
                message["content"] = content
                if parsed:
                    message["tool_calls"] = [call.openai() for call in parsed]
                calls = len(parsed)
            out["message"] = message
        else:
            out["text"] = text
        out["logprobs"] = None if self.req.logprobs is None else self._logprobs(choice.logprobs, 0)
        out["finish_reason"] = self._finish_reason(choice, calls)
        if self.req.return_token_ids:
            if not self.chat:
                out["prompt_token_ids"] = list(self.req.prompt_ids)
            out["token_ids"] = list(choice.token_ids)
        return out

    def _base(self, suffix: str) -> JSON:
        name = ("chat.completion" + suffix) if self.chat else "text_completion"
        body: JSON = {"id": self.id, "object": name, "created": self.created, "model": self.model}
        if self.chat:
            body["system_fingerprint"] = None
        return body

    def _chunk(self, choice: JSON | None) -> JSON:
        body = self._base(".chunk")
        body["choices"] = [] if choice is None else [choice]
        if self.req.include_usage:
            body["usage"] = None
        if self.req.return_token_ids and not self._prompt_sent:
            self._prompt_sent = True
            target = body if self.chat else (choice if choice is not None else body)
            target["prompt_token_ids"] = list(self.req.prompt_ids)
        return body

    def _choice(
        self, index: int, text: str | None, token_ids: list[int], finish: str | None
    ) -> JSON:
        choice: JSON = {"index": index}
        if self.chat:
            choice["delta"] = {} if text is None else {"content": text}
        else:
            choice["text"] = text or ""
        _with_finish(choice, finish)
        if self.req.return_token_ids:
            choice["token_ids"] = token_ids
        return choice

    def _text_chunk(self, index: int, text: str, ids: list[int], logprobs: JSON | None) -> JSON:
        chunk = self._chunk(self._choice(index, text, ids, None))
        if logprobs is not None:
            chunk["choices"][0]["logprobs"] = logprobs
        return chunk

    def _delta_chunk(self, index: int, delta: JSON) -> JSON:
        choice = _with_finish({"index": index, "delta": delta}, None)
        if self.req.return_token_ids:
            choice["token_ids"] = []
        return self._chunk(choice)

    @staticmethod
    def _attach(chunk: JSON, logprobs: JSON | None, ids: list[int]) -> None:
        choice = chunk["choices"][0]
        if logprobs is not None:
            choice["logprobs"] = logprobs
        if "token_ids" in choice:
            choice["token_ids"] = ids

    def _logprobs(self, events: list[TokenEvent], offset: int) -> JSON:
        if self.chat:
            return {"content": [self._chat_entry(e) for e in events if e.token_id is not None]}
        tokens, logprobs, tops, offsets = [], [], [], []
        for e in events:
            if e.token_id is None:
                continue
            tokens.append(self._text(e.token_id))
            logprobs.append(e.logprob)
            tops.append({self._text(t): lp for t, lp in e.top_logprobs})
            offsets.append(offset)
            offset += len(e.text)
        return {
            "tokens": tokens,
            "token_logprobs": logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _chat_entry(self, event: TokenEvent) -> JSON:
        assert event.token_id is not None
        entry = self._token(event.token_id, event.logprob)
        # OpenAI lists no alternatives without top_logprobs (the engine's list is the sampled
        # token alone then).
        tops = event.top_logprobs if self.req.logprobs else ()
        entry["top_logprobs"] = [self._token(t, lp) for t, lp in tops]
        return entry

    def _token(self, token: int, logprob: float | None) -> JSON:
        raw = self.token_bytes(token)
        return {
            "token": raw.decode("utf-8", errors="replace"),
            "logprob": logprob,
            "bytes": list(raw),
        }

    def _text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace")


def _delta(delta: Delta) -> JSON:
    """A chunk's `delta`: content text, or one entry of `tool_calls`."""
    if isinstance(delta, CallDelta):
        return {"tool_calls": [delta.openai()]}
    return delta.openai()


def _with_finish(choice: JSON, finish: str | None) -> JSON:
    choice["logprobs"] = None
    choice["finish_reason"] = finish
    return choice
