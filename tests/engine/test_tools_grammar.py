"""engine/tools/grammar.py: the grammars compile in llguidance, and whatever a sampler walking
their allowed tokens writes is parsed back into calls whose arguments fit the tool's schema.

The tokenizer is byte-level (so every text is reachable), plus a few longer tokens that span
the format's fixed parts, as a real vocabulary's would.
"""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import llguidance
import pytest

from engine.tools import ToolSpec, parse_complete, parse_tools, tool_grammar

WEATHER_PARAMETERS = {
    "type": "object",
    "$defs": {"unit": {"enum": ["celsius", "fahrenheit"], "description": 'a {unit} // # "q"'}},
    "properties": {
        "city": {"type": "string", "maxLength": 8, "description": "}{ <tool_call>"},
        "unit": {"$ref": "#/$defs/unit"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
SEARCH_PARAMETERS = {
    "type": "object",
    "properties": {
        "query": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]},
        "filter": {
            "type": "object",
            "properties": {"kind": {"const": "news"}, "fresh": {"type": "boolean"}},
            "required": ["kind"],
            "additionalProperties": False,
        },
        "limit": {"type": "number", "minimum": 0, "maximum": 10},
    },
    "required": ["query", "filter"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS, "strict": True},
    },
    {"type": "function", "function": {"name": "search", "parameters": SEARCH_PARAMETERS}},
    {"type": "function", "function": {"name": "now", "description": "The time"}},
]
EXTRA_TOKENS = [b"<tool_call>\n", b"\n</tool_call>", b'{"name": "', b'", "arguments": {"']
CLOSING = frozenset(b'"}],') | {256 + len(EXTRA_TOKENS)}


class ByteVocabulary:
    """What llguidance.TokenizerWrapper reads: 256 bytes, longer tokens, then EOS."""

    def __init__(self) -> None:
        self.tokens = [bytes([i]) for i in range(256)] + EXTRA_TOKENS + [b"<eos>"]
        self.eos_token_id = len(self.tokens) - 1
        self.bos_token_id = None
        self.special_token_ids = [self.eos_token_id]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocabulary()))
EOS = TOKENIZER.eos_token


def spec_of(**body: Any) -> ToolSpec:
    spec = parse_tools({"tools": TOOLS, **body})
    assert spec is not None
    return spec


def compile_error(grammar: str) -> str:
    return llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar))


def walk(grammar: str, rng: random.Random, limit: int = 20_000) -> str:
    """Sample uniformly among allowed tokens (leaning to closing ones, so strings end) to EOS."""
    matcher = llguidance.LLMatcher(TOKENIZER, llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not matcher.is_error(), matcher.get_error()
    out: list[int] = []
    for _ in range(limit):
        mask = matcher.compute_bitmask()
        allowed = [t for t in range(TOKENIZER.vocab_size) if mask[t // 8] >> (t % 8) & 1]
        closing = [t for t in allowed if t in CLOSING]
        token = rng.choice(closing if closing and rng.random() < 0.15 else allowed)
        assert matcher.consume_token(token), matcher.get_error()
        if token == EOS:
            assert matcher.is_accepting()
            return TOKENIZER.decode_str(out)
        out.append(token)
    raise AssertionError("the walk did not end")


def test_no_tools_is_unconstrained() -> None:
    assert tool_grammar(None) is None


def allows(grammar: str, text: str) -> bool:
    """Whether the grammar accepts all of `text` (byte by byte) and may end there."""
    lark = llguidance.LLMatcher.grammar_from_lark(grammar)
    matcher = llguidance.LLMatcher(TOKENIZER, lark, log_level=0)
    for token in text.encode():
        if not matcher.consume_token(token):
            return False
    return matcher.consume_token(EOS)


def test_auto_allows_text_or_well_formed_calls_but_no_other_tag_first() -> None:
    grammar = tool_grammar(spec_of())
    assert grammar is not None
    call = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    for text in ("Sunny, 21 C.", "<b>bold</b>", "a <tool_call> in the middle", "<too", call):
        assert allows(grammar, text), text
    for text in ("<tool_response>\n[]\n</tool_response>", '<tool_call>\n{"name": "nope"'):
        assert not allows(grammar, text), text
    two = call + "\n" + call
    assert allows(grammar, two)
    assert not allows(str(tool_grammar(spec_of(parallel_tool_calls=False))), two)


@pytest.mark.parametrize(
    "body",
    [
        {"tool_choice": "required"},
        {"tool_choice": "required", "parallel_tool_calls": False},
        {"tool_choice": {"type": "function", "function": {"name": "search"}}},
    ],
)
def test_the_grammars_compile(body: dict[str, Any]) -> None:
    grammar = tool_grammar(spec_of(**body))
    assert grammar is not None
    assert compile_error(grammar) == ""


def test_strict_schemas_are_enforced_or_refused() -> None:
    unenforceable = {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": unenforceable}}
    lenient = parse_tools({"tools": [tool], "tool_choice": "required"})
    assert compile_error(tool_grammar(lenient) or "") == ""
    tool["function"]["strict"] = True  # type: ignore[index]
    strict = parse_tools({"tools": [tool], "tool_choice": "required"})
    assert "not" in compile_error(tool_grammar(strict) or "")


def check_calls(text: str, spec: ToolSpec) -> list[str]:
    content, calls = parse_complete(text, spec.names)
    assert content is None, text
    assert calls, text
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), dict(spec.tool(call.name).parameters))
    return [call.name for call in calls]


@pytest.mark.parametrize("seed", range(12))
def test_required_writes_calls_that_parse_and_fit(seed: int) -> None:
    spec = spec_of(tool_choice="required")
    text = walk(tool_grammar(spec) or "", random.Random(seed))
    names = check_calls(text, spec)
    assert text.count("<tool_call>") == len(names)


@pytest.mark.parametrize("seed", range(6))
def test_not_parallel_writes_exactly_one_call(seed: int) -> None:
    spec = spec_of(tool_choice="required", parallel_tool_calls=False)
    text = walk(tool_grammar(spec) or "", random.Random(seed))
    assert len(check_calls(text, spec)) == 1


@pytest.mark.parametrize("seed", range(6))
def test_a_named_function_is_called_once(seed: int) -> None:
    spec = spec_of(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    text = walk(tool_grammar(spec) or "", random.Random(seed))
    assert check_calls(text, spec) == ["get_weather"]
    assert text.startswith('<tool_call>\n{"name": "get_weather", "arguments": {')
    assert text.endswith("}}\n</tool_call>")
