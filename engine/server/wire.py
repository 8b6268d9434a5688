"""OpenAI response bodies: chat.completion(.chunk) and text_completion, plus SSE framing.

The gateway relays these bytes untouched and the official `openai` client parses them, so the
shapes follow OpenAI exactly (`usage: null` on chunks before the usage chunk when usage was
asked for; a separate finish chunk with an empty delta). `return_token_ids` follows vLLM: chat
puts `prompt_token_ids` at the top level (first chunk / the response), completions put it on
the choice; every choice carries `token_ids`, the generated ids it adds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from engine.api import TokenEvent
from engine.server.errors import JSON
from engine.server.parse import ParsedRequest

DONE = b"data: [DONE]\n\n"


def sse(payload: JSON) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def usage(event: TokenEvent) -> JSON:
    total = event.prompt_tokens + event.completion_tokens
    return {
        "prompt_tokens": event.prompt_tokens,
        "completion_tokens": event.completion_tokens,
        "total_tokens": total,
    }


@dataclass(slots=True)
class Bodies:
    """Every body of one response, so all its chunks share id, created and model."""

    req: ParsedRequest
    id: str
    created: int
    model: str
    _prompt_sent: bool = field(default=False, init=False)

    @property
    def chat(self) -> bool:
        return self.req.kind == "chat"

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

    def _choice(self, text: str | None, token_ids: Sequence[int], finish: str | None) -> JSON:
        choice: JSON = {"index": 0}
        if self.chat:
            choice["delta"] = {} if text is None else {"content": text}
        else:
            choice["text"] = text or ""
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        if self.req.return_token_ids:
            choice["token_ids"] = list(token_ids)
        return choice

    def opening(self) -> list[JSON]:
        """Chat announces the assistant role before any token; completions have no opener."""
        if not self.chat:
            return []
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}}
        choice |= {"logprobs": None, "finish_reason": None}
        return [self._chunk(choice)]

    def chunks(self, event: TokenEvent) -> list[JSON]:
        """The chunks one engine event makes: its text (or bare token), then the finish."""
        out: list[JSON] = []
        ids = [] if event.token_id is None else [event.token_id]
        if event.text or (self.req.return_token_ids and ids):
            out.append(self._chunk(self._choice(event.text, ids, None)))
        if event.finished:
            out.append(self._chunk(self._choice(None, [], event.finish_reason)))
        return out

    def usage_chunk(self, last: TokenEvent) -> JSON:
        body = self._chunk(None)
        body["usage"] = usage(last)
        return body

    def full(self, text: str, token_ids: Sequence[int], last: TokenEvent) -> JSON:
        body = self._base("")
        choice: JSON = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice |= {"logprobs": None, "finish_reason": last.finish_reason}
        if self.req.return_token_ids:
            prompt_ids = list(self.req.prompt_ids)
            (body if self.chat else choice)["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = list(token_ids)
        body["choices"] = [choice]
        body["usage"] = usage(last)
        return body
