"""Structured output and tool calls end to end, over the real engine: for schemas drawn by
hypothesis every answer parses and validates, at temperature 0 and 1, streamed and whole, on
one node and on a unit of two (the leader masks, followers run their shard as ever)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from engine.grammar import GrammarBackend, GrammarError, json_schema_grammar
from engine.model import ByteTokenizer
from engine.runtime.leader import LeaderEngine
from tests.engine.test_grammar_schemas import SCHEMAS
from tests.engine.test_runtime_support import kill_all, start_unit
from tests.engine.test_server_double import chunks, post, served, sse_events
from tests.engine.test_server_sampling import MODEL, start_engine

CHAT = "/v1/chat/completions"
Schema = dict[str, Any]
BACKEND = GrammarBackend(ByteTokenizer(), ByteTokenizer().vocab_size)  # the served model's
# 0.25 is the one value, and the grammar library compiles the schema to no output at all.
EMPTY = {"type": "number", "exclusiveMinimum": 0.125, "maximum": 0.25, "multipleOf": 0.125}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_products",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": 12},
                "max_price": {"type": "number", "minimum": 0, "maximum": 500},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
CART = {
    "type": "function",
    "function": {
        "name": "add_to_cart",
        "parameters": {
            "type": "object",
            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}},
            "required": ["sku"],
        },
    },
}


class Unit:
    """A served engine the hypothesis tests reuse across examples (a fixture per example
    would start an engine per example)."""

    def __init__(self, engine: LeaderEngine) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self._served = served(engine)
        self.url = self.loop.run_until_complete(self._served.__aenter__())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self._served.__aexit__(None, None, None))
        self.loop.close()
        self.engine.shutdown()


@pytest.fixture(scope="module")
def single() -> Iterator[Unit]:
    unit = Unit(start_engine())
    yield unit
    unit.close()


async def answer_text(url: str, body: dict[str, Any], stream: bool) -> tuple[str, str]:
    """(text, finish_reason) of a one-choice answer, whole or streamed."""
    if not stream:
        status, answer = await post(url + CHAT, body)
        assert status == 200, answer
        choice = answer["choices"][0]
        return choice["message"]["content"], choice["finish_reason"]
    response, events = await sse_events(url + CHAT, {**body, "stream": True})
    assert response.status == 200, events
    assert events[-1] == "[DONE]"
    text, finish = "", ""
    for chunk in chunks(events):
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
            finish = choice["finish_reason"] or finish
    return text, finish


# The tiny model's weights are random: nothing makes it end an unbounded number or string
# (a trained model ends them). A bias towards its stop tokens makes it end wherever the grammar
# allows an end, so every answer finishes; what the grammar requires is still all there.
STOP_BIAS = {str(token): 5 for token in ByteTokenizer().stop_ids}


def schema_body(schema: Schema, temperature: float, seed: int) -> dict[str, Any]:
    spec = {"name": "answer", "schema": schema, "strict": True}
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "response_format": {"type": "json_schema", "json_schema": spec},
        "temperature": temperature,
        "seed": seed,
        "max_tokens": 600,
        "logit_bias": STOP_BIAS,
    }


def bounded(schema: Any) -> Any:
    """The schema with every number bounded in size: integers get both bounds, numbers both
    bounds and a step. Every answer then has a length limit, so the random model's answers
    end within max_tokens (unbounded, it may write digits until the tokens run out)."""
    if isinstance(schema, list):
        return [bounded(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: bounded(value) for key, value in schema.items() if key != "enum"}
    if "enum" in schema:
        out["enum"] = schema["enum"]
    if schema.get("type") in ("integer", "number"):
        low = max(schema.get("minimum", -1000), schema.get("exclusiveMinimum", -1000))
        out.setdefault("maximum", low + 2000)
        if "minimum" not in schema and "exclusiveMinimum" not in schema:
            out["minimum"] = -1000
    if schema.get("type") == "number":
        out["multipleOf"] = 0.125
    return out


def refused_or_bounded(schema: Schema) -> Schema:
    """`bounded(schema)`; a schema strict mode refuses (a number range the grammar library
    cannot enforce exactly: test_grammar_bounds.py), or one it compiles to no output at all
    (test_the_server_refuses_a_schema_that_admits_no_output), is not an example here."""
    schema = bounded(schema)
    try:
        BACKEND.check(json_schema_grammar(schema, strict=True))
    except GrammarError:
        reject()
    return schema


def check_answer(schema: Schema, text: str, finish: str) -> None:
    assert finish == "stop", (finish, text)
    jsonschema.validate(json.loads(text), schema)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    schema=SCHEMAS,
    temperature=st.sampled_from([0.0, 1.0]),
    stream=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_every_answer_validates_against_its_schema(
    single: Unit, schema: Schema, temperature: float, stream: bool, seed: int
) -> None:
    schema = refused_or_bounded(schema)
    body = schema_body(schema, temperature, seed)
    text, finish = single.run(answer_text(single.url, body, stream))
    check_answer(schema, text, finish)


@pytest.mark.parametrize("stream", [False, True])
def test_the_server_refuses_a_schema_that_admits_no_output(single: Unit, stream: bool) -> None:
    """Not an empty answer that says "stop" (what the engine sent before it checked)."""
    body = {**schema_body(EMPTY, 0.0, 0), "stream": stream}
    status, answer = single.run(post(single.url + CHAT, body))
    assert status == 400, answer
    assert "nothing can be generated that the grammar allows" in answer["error"]["message"]


def test_json_object_answers_are_objects(single: Unit) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "JSON please"}],
        "response_format": {"type": "json_object"},
        "max_tokens": 600,
        "temperature": 1,
        "seed": 5,
    }
    text, finish = single.run(answer_text(single.url, body, stream=True))
    assert finish == "stop" and isinstance(json.loads(text), dict)


def test_structured_outputs_regex_and_choice(single: Unit) -> None:
    base = {"model": MODEL, "messages": [{"role": "user", "content": "?"}], "max_tokens": 40}
    body = {**base, "structured_outputs": {"regex": "[A-Z]{2}[0-9]{3}"}, "temperature": 1}
    text, finish = single.run(answer_text(single.url, body, stream=False))
    assert finish == "stop" and len(text) == 5 and text[:2].isupper() and text[2:].isdigit()
    body = {**base, "structured_outputs": {"choice": ["small", "medium", "large"]}}
    text, _ = single.run(answer_text(single.url, body, stream=True))
    assert text in ("small", "medium", "large")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "add_to_cart"}}],
)
def test_forced_calls_validate_against_the_tools_schema(
    single: Unit, stream: bool, choice: Any
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "shoes please"}],
        "tools": [SEARCH, CART],
        "tool_choice": choice,
        "parallel_tool_calls": False,
        "temperature": 1,
        "seed": 3,
        "max_tokens": 200,
    }
    calls, finish = single.run(tool_calls(single.url, body, stream))
    assert finish == "tool_calls" and len(calls) == 1
    call = calls[0]
    assert call["id"].startswith("call_") and call["type"] == "function"
    name = call["function"]["name"]
    if isinstance(choice, dict):
        assert name == "add_to_cart"
    schema = {"search_products": SEARCH, "add_to_cart": CART}[name]["function"]["parameters"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), schema)


async def tool_calls(url: str, body: dict[str, Any], stream: bool) -> tuple[list[Any], str]:
    """The answer's tool calls as OpenAI's whole-message shape, from either wire form."""
    if not stream:
        status, answer = await post(url + CHAT, body)
        assert status == 200, answer
        choice = answer["choices"][0]
        return choice["message"].get("tool_calls") or [], choice["finish_reason"]
    _, events = await sse_events(url + CHAT, {**body, "stream": True})
    calls: dict[int, dict[str, Any]] = {}
    finish = ""
    for chunk in chunks(events):
        for choice in chunk["choices"]:
            finish = choice["finish_reason"] or finish
            for delta in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(delta["index"], {"function": {"arguments": ""}})
                for key in ("id", "type"):
                    if key in delta:
                        call[key] = delta[key]
                function = delta.get("function", {})
                if "name" in function:
                    call["function"]["name"] = function["name"]
                call["function"]["arguments"] += function.get("arguments", "")
    return [calls[i] for i in sorted(calls)], finish


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unit]:
    engine, follower = start_unit(tmp_path_factory.mktemp("pair"), timeout=30.0)
    unit = Unit(engine)
    try:
        yield unit
    finally:
        unit.close()
        assert follower.wait(20) == 0, follower.log()
        kill_all(follower)


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, temperature=st.sampled_from([0.0, 1.0]), seed=st.integers(0, 2**31))
def test_a_unit_of_two_answers_valid_json_too(
    pair: Unit, schema: Schema, temperature: float, seed: int
) -> None:
    schema = refused_or_bounded(schema)
    body = schema_body(schema, temperature, seed)
    text, finish = pair.run(answer_text(pair.url, body, stream=seed % 2 == 0))
    check_answer(schema, text, finish)
