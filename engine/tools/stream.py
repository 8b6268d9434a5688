"""Streamed text deltas -> content deltas and OpenAI `tool_calls` deltas.

Content streams as it comes, except what cannot be settled yet: the end of a delta that may
begin `<tool_call>`, and a call until its object and closing tag are complete (then it is
sent whole: a head delta with id, type and name, and one delta with all of its arguments).
A `<tool_call>` followed by JSON that does not parse (a malformed block, rare) cannot be told
from one still being written, so everything after it waits for `finish()`. Content is
stripped as `parse_complete` strips it: leading whitespace is dropped and trailing whitespace
is held until more content follows. `finish()` settles the rest with the same rules as
`parse_complete`, so the deltas of any split add up to what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.tools.calls import CallIds, ToolCall, random_call_id
from engine.tools.scan import Call, next_event


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str

    def openai(self) -> dict[str, Any]:
        """The chunk's `delta`."""
        return {"content": self.text}


@dataclass(frozen=True, slots=True)
class CallDelta:
    """One entry of a chunk's `delta.tool_calls`: the head (id and name set, arguments "")
    or a piece of the arguments of call `index` (id and name None)."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def openai(self) -> dict[str, Any]:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


Delta = TextDelta | CallDelta


class ToolStream:
    def __init__(self, names: frozenset[str], new_id: CallIds = random_call_id) -> None:
        self.names, self.new_id = names, new_id
        self.calls: list[ToolCall] = []
        self._pending = ""  # text not settled yet
        self._held = ""  # trailing whitespace of the content so far
        self._started = False  # some content was sent

    def feed(self, delta: str) -> list[Delta]:
        self._pending += delta
        return self._settle(final=False)

    def finish(self) -> list[Delta]:
        """At the end of the answer: the rest, settled; held trailing whitespace is dropped."""
        out = self._settle(final=True)
        self._held = ""
        return out

    def _settle(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while self._pending:
            event, used = next_event(self._pending, self.names, final)
            if event is None:
                break
            self._pending = self._pending[used:]
            out += self._call(event) if isinstance(event, Call) else self._content(event.text)
        return out

    def _call(self, event: Call) -> list[Delta]:
        call = ToolCall(self.new_id(), event.name, event.arguments)
        index = len(self.calls)
        self.calls.append(call)
        return [CallDelta(index, "", call.id, call.name), CallDelta(index, call.arguments)]

    def _content(self, text: str) -> list[Delta]:
        if not self._started:
            text = text.lstrip()
            self._started = bool(text)
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body) :]
        return [TextDelta(body)] if body else []
