"""engine/tools/parser.py and stream.py: calls found in model text, whole or streamed; any
split of a text streams to what the whole text parses to."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.tools import (
    CallDelta,
    Delta,
    TextDelta,
    ToolCall,
    ToolStream,
    finish_reason,
    parse_complete,
    random_call_id,
)
from engine.tools.calls import CallIds

NAMES = frozenset({"get_weather", "now"})


def ids() -> CallIds:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def parse(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    content, calls = parse_complete(text, NAMES, ids())
    return content, [(call.name, call.arguments) for call in calls]


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


WEATHER = '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}'
NOW = '{"name": "now"}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", (None, [])),
        ("  \n", (None, [])),
        ("Just text. ", ("Just text.", [])),
        (block(WEATHER), (None, [("get_weather", '{"city":"Oslo","days":2}')])),
        (
            f"Let me check.\n{block(WEATHER)}\n{block(NOW)}\n",
            ("Let me check.", [("get_weather", '{"city":"Oslo","days":2}'), ("now", "{}")]),
        ),
        (  # arguments as JSON text, OpenAI's wire form
            block('{"name": "now", "arguments": "{\\"tz\\": \\"UTC\\"}"}'),
            (None, [("now", '{"tz":"UTC"}')]),
        ),
        (  # numbers as written, non-ASCII as is
            block('{"name": "now", "arguments": {"n": 633E3, "big": 1e400, "é": [-0.0]}}'),
            (None, [("now", '{"n":633E3,"big":1e400,"é":[-0.0]}')]),
        ),
        (  # the closing tag inside a string does not end the block
            block('{"name": "now", "arguments": {"q": "</tool_call> <tool_call>"}}') + " ok",
            ("ok", [("now", '{"q":"</tool_call> <tool_call>"}')]),
        ),
        (  # the closing tag missing, or cut short, at the end
            '<tool_call>{"name": "now"}',
            (None, [("now", "{}")]),
        ),
        ('<tool_call>\n{"name": "now"}\n</tool_', (None, [("now", "{}")])),
        ("Answer <tool_call", ("Answer <tool_call", [])),
        ("a <toolbox> b", ("a <toolbox> b", [])),
    ],
)
def test_parse_complete(text: str, expected: tuple[str | None, list[tuple[str, str]]]) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "unknown", "arguments": {}}',
        '{"name": 5, "arguments": {}}',
        '{"name": "now", "arguments": [1]}',
        '{"name": "now", "arguments": "{oops"}',
        '{"name": "now", "arguments": {"x": NaN}}',
        '{"name": "now", "arguments": {"x": 1',
        '["now"]',
        "I cannot call tools.",
        '{"name": "now"} and more',
        "[" * 100_000,
    ],
)
def test_a_block_that_is_not_a_call_stays_content(body: str) -> None:
    text = f"Before. {block(body)} After. {block(WEATHER)}"
    content, calls = parse(text)
    assert content == f"Before. {block(body)} After."
    assert calls == [("get_weather", '{"city":"Oslo","days":2}')]


def test_an_unterminated_block_is_content() -> None:
    text = 'Sure: <tool_call>\n{"name": "get_weather", "arguments": {"city": "Os'
    assert parse(text) == (text, [])


def test_calls_have_openai_ids_and_shape() -> None:
    _, calls = parse_complete(block(WEATHER), NAMES)
    call_id = calls[0].id
    assert call_id.startswith("call_") and len(call_id) == 29 and call_id[5:].isalnum()
    assert random_call_id() != random_call_id()
    assert calls[0].openai() == {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo","days":2}'},
    }


def test_finish_reason() -> None:
    assert finish_reason("stop", 1) == "tool_calls"
    assert finish_reason("length", 2) == "tool_calls"
    assert finish_reason("length", 0) == "length"


def test_a_partial_tag_is_held_then_released() -> None:
    stream = ToolStream(NAMES, ids())
    assert stream.feed("Hi <tool") == [TextDelta("Hi")]
    assert stream.feed("box") == [TextDelta(" <toolbox")]
    assert stream.feed(" <tool_") == []
    assert stream.feed('call>\n{"name": "now", "arg') == []
    assert stream.feed('uments": {}}\n</tool_call>') == [
        CallDelta(0, "", "call_0", "now"),
        CallDelta(0, "{}"),
    ]
    assert stream.finish() == []
    assert stream.calls == [ToolCall("call_0", "now", "{}")]


def test_call_deltas_in_openai_form() -> None:
    head, arguments = CallDelta(1, "", "call_x", "now"), CallDelta(1, '{"a":1}')
    assert head.openai() == {
        "index": 1,
        "id": "call_x",
        "type": "function",
        "function": {"name": "now", "arguments": ""},
    }
    assert arguments.openai() == {"index": 1, "function": {"arguments": '{"a":1}'}}
    assert TextDelta("hi").openai() == {"content": "hi"}


def test_finish_releases_an_unterminated_block() -> None:
    stream = ToolStream(NAMES, ids())
    assert stream.feed("Sure <tool_call>\n{") == [TextDelta("Sure")]
    assert stream.finish() == [TextDelta(" <tool_call>\n{")]


FRAGMENTS = [
    block(WEATHER),
    block('{"name": "now", "arguments": {"q": "</tool_call>"}}'),
    block('{"name": "unknown", "arguments": {}}'),
    block("not json"),
    block('{"name": "now", "arguments": {"x": 1'),
    '<tool_call>{"name": "now"}',
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "<tool_call ",
    "Hello, world.",
    "  ",
    "\n",
    "é 🏃",
]
TEXTS = st.lists(
    st.sampled_from(FRAGMENTS) | st.text(alphabet='<>/_tolcan {}":\n', max_size=6), max_size=8
).map("".join)


@st.composite
def splits(draw: st.DrawFn) -> list[str]:
    text = draw(TEXTS)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    return [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]


def collect(deltas: list[Delta]) -> tuple[str, dict[int, list[CallDelta]]]:
    text, calls = "", dict[int, list[CallDelta]]()
    for delta in deltas:
        if isinstance(delta, TextDelta):
            assert delta.text
            text += delta.text
        else:
            calls.setdefault(delta.index, []).append(delta)
    return text, calls


@settings(max_examples=400, deadline=None)
@given(splits())
def test_any_split_streams_to_the_whole_parse(pieces: list[str]) -> None:
    content, calls = parse_complete("".join(pieces), NAMES, ids())
    stream = ToolStream(NAMES, ids())
    deltas = [delta for piece in pieces for delta in stream.feed(piece)] + stream.finish()
    streamed, by_index = collect(deltas)
    assert streamed == (content or "")
    assert stream.calls == calls
    assert sorted(by_index) == list(range(len(calls)))
    for index, call in enumerate(calls):
        head, *rest = by_index[index]
        assert (head.id, head.name, head.arguments) == (call.id, call.name, "")
        assert all(d.id is None and d.name is None for d in rest)
        assert "".join(d.arguments for d in rest) == call.arguments
        json.loads(call.arguments)
