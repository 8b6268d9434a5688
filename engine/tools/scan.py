"""Finds `<tool_call>` blocks in model text: the one decision both parsers make.

`next_event(text, names, final)` looks at the start of the undecided text and returns the
next piece that is settled, plain text or a call, with how many characters it used. With
`final` False (streaming) it decides only what no continuation can change, and otherwise asks
for more text; with `final` True the text is all there is. Both parsers loop over it, so a
stream cut anywhere yields what the whole text yields.

A block is `<tool_call>`, whitespace, one JSON object, whitespace and `</tool_call>`. The
object is a call when it has a `name` among the request's tools and `arguments` that are an
object (or the JSON text of one; missing means `{}`); other keys are ignored. Anything else
is never turned into a call: the block stays in the content as the model wrote it, up to and
including the first `</tool_call>` after the opening tag (or to the end of the text). At the
end of the text a block whose closing tag is missing or cut short still counts when its
object is complete: some models omit the tag, and the object is all a call needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.tools.format import CLOSE, OPEN
from engine.tools.jsontext import DECODER, compact

_SPACE = " \t\n\r"


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    arguments: str  # compact JSON of an object


Event = Text | Call
Step = tuple[Event | None, int]  # (None, 0): nothing is settled until more text comes


def next_event(text: str, names: frozenset[str], final: bool) -> Step:
    start = text.find(OPEN)
    if start > 0:
        return Text(text[:start]), start
    if start == 0:
        return _block(text, names, final)
    keep = 0 if final else _partial_tag(text)
    settled = len(text) - keep
    return (Text(text[:settled]), settled) if settled else (None, 0)


def _partial_tag(text: str) -> int:
    """The length of the longest end of `text` that begins the opening tag."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


def _block(text: str, names: frozenset[str], final: bool) -> Step:
    body = _skip_space(text, len(OPEN))
    if body < len(text) and text[body] != "{":
        return _not_a_call(text, final)
    try:
        value, end = DECODER.raw_decode(text, body)
    except (ValueError, RecursionError):  # not valid JSON, or not yet complete
        return _not_a_call(text, final) if final else (None, 0)
    after = _skip_space(text, end)
    if text.startswith(CLOSE, after):
        return _decide(text, value, names, after + len(CLOSE))
    if CLOSE.startswith(text[after:]):  # nothing more yet, or part of the closing tag
        return _decide(text, value, names, len(text)) if final else (None, 0)
    return _not_a_call(text, final)


def _decide(text: str, value: Any, names: frozenset[str], end: int) -> Step:
    call = _call(value, names)
    return (call if call else Text(text[:end])), end


def _call(value: Any, names: frozenset[str]) -> Call | None:
    if not isinstance(value, dict) or type(value.get("name")) is not str:  # not a Number
        return None
    if value["name"] not in names:
        return None
    arguments = value.get("arguments", {})
    if type(arguments) is str:
        try:
            arguments = DECODER.decode(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return Call(value["name"], compact(arguments))


def _not_a_call(text: str, final: bool) -> Step:
    close = text.find(CLOSE, len(OPEN))
    if close >= 0:
        end = close + len(CLOSE)
        return Text(text[:end]), end
    return (Text(text), len(text)) if final else (None, 0)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at
