"""What a shopping assistant asks, on the real model (SmolLM2-135M-Instruct from the packaged
GGUF, one node): the quick start's tool call and product card, a tool result that continues
the conversation, and the same tool question answered in a stream of tool_calls deltas.

SmolLM2's chat template has no tool format, so the model sees the tools in its system prompt
(engine/tools). The history's earlier call and result show it how a call looks; with "auto"
the grammar then holds a call it starts to a well-formed one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from engine.backends.builtin.node import start_leader
from engine.flags import parse
from engine.runtime.leader import LeaderEngine
from tests.engine.test_server_double import chunks, post, served, sse_events

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
CHAT = "/v1/chat/completions"
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_products",
        "description": "Search the shop's catalogue for products matching a query.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "max_price": {"type": "number"}},
            "required": ["query"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Find trail running shoes."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "search_products",
                    "arguments": '{"query": "trail running shoes"}',
                },
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": '[{"name": "Peak Trail 2", "price": 89}]',
    },
    {"role": "assistant", "content": "I found the Peak Trail 2 for $89."},
]
QUESTION = {"role": "user", "content": "Find running shoes for flat feet under $100."}
CARD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 60},
        "price": {"type": "number", "minimum": 0},
        "reasons": {
            "type": "array",
            "items": {"type": "string", "maxLength": 80},
            "minItems": 1,
            "maxItems": 3,
        },
    },
    "required": ["name", "price", "reasons"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine() -> Any:
    flags = ["--role", "leader", "--model", "smollm2", "--max-seq-len", "1024"]
    leader: LeaderEngine = start_leader(parse([*flags, "--num-slots", "2"]))
    yield leader
    leader.shutdown()


@pytest.fixture
async def url(engine: LeaderEngine) -> AsyncIterator[str]:
    async with served(engine) as base:
        yield base + CHAT


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "temperature": 0, "max_tokens": 120, **extra}


async def test_auto_parses_the_call_a_product_question_needs(url: str) -> None:
    status, answer = await post(url, body(messages=[*HISTORY, QUESTION], tools=[SEARCH]))
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "search_products"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, SEARCH["function"]["parameters"])
    assert "shoes" in arguments["query"]

    # The tool's result goes back; the conversation continues in text.
    result = '[{"name": "Arch Runner", "price": 79}]'
    follow = [
        *HISTORY,
        QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result},
    ]
    status, answer = await post(url, body(messages=follow, tools=[SEARCH]))
    assert status == 200, answer
    message = answer["choices"][0]["message"]
    assert message.get("tool_calls") is None and message["content"], answer


async def test_auto_answers_in_text_when_no_tool_is_needed(url: str) -> None:
    question = {"role": "user", "content": "What is the capital of France?"}
    status, answer = await post(url, body(messages=[question], tools=[SEARCH]))
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop" and "Paris" in choice["message"]["content"]


async def test_a_named_call_streams_as_tool_calls_deltas(url: str) -> None:
    named = {"type": "function", "function": {"name": "search_products"}}
    request = body(messages=[QUESTION], tools=[SEARCH], tool_choice=named, stream=True)
    _, events = await sse_events(url, request)
    deltas = [c["choices"][0] for c in chunks(events) if c["choices"]]
    calls = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "search_products"
    arguments = "".join(c["function"]["arguments"] for c in calls)
    jsonschema.validate(json.loads(arguments), SEARCH["function"]["parameters"])
    assert deltas[-1]["finish_reason"] == "tool_calls"
    assert not any(d["delta"].get("content") for d in deltas)


async def test_a_product_card_follows_its_schema(url: str) -> None:
    ask = {
        "role": "user",
        "content": "Recommend one running shoe for flat feet as a product card "
        "with its name, its price in USD and up to three reasons.",
    }
    spec = {"name": "product_card", "schema": CARD, "strict": True}
    request = body(
        messages=[ask], response_format={"type": "json_schema", "json_schema": spec}, max_tokens=200
    )
    status, answer = await post(url, request)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    card = json.loads(choice["message"]["content"])
    jsonschema.validate(card, CARD)
    assert card["name"] and card["reasons"][0]


async def test_both_at_once_share_the_batch(url: str, engine: LeaderEngine) -> None:
    """Two constrained requests in one batch: each keeps its own grammar."""
    spec = {"name": "product_card", "schema": CARD, "strict": True}
    card = body(messages=[QUESTION], response_format={"type": "json_schema", "json_schema": spec})
    call = body(messages=[*HISTORY, QUESTION], tools=[SEARCH], tool_choice="required")
    (s1, a1), (s2, a2) = await asyncio.gather(
        post(url, card | {"max_tokens": 200}), post(url, call)
    )
    assert s1 == s2 == 200
    jsonschema.validate(json.loads(a1["choices"][0]["message"]["content"]), CARD)
    assert a2["choices"][0]["message"]["tool_calls"]
    assert engine.scheduler.free_slots == 2
