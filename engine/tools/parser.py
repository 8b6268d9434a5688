"""A whole answer -> its content and tool calls (the block rules are in `scan.py`)."""

from __future__ import annotations

from engine.tools.calls import CallIds, ToolCall, random_call_id
from engine.tools.scan import Call, next_event


def parse_complete(
    text: str, names: frozenset[str], new_id: CallIds = random_call_id
) -> tuple[str | None, list[ToolCall]]:
    """The text outside the calls, stripped (None when nothing is left), and the calls in
    order. A block that is not a well-formed call to one of `names` stays in the content."""
    pieces: list[str] = []
    calls: list[ToolCall] = []
    while text:
        event, used = next_event(text, names, final=True)
        if isinstance(event, Call):
            calls.append(ToolCall(new_id(), event.name, event.arguments))
        elif event is not None:
            pieces.append(event.text)
        text = text[used:]
    content = "".join(pieces).strip()
    return content or None, calls
