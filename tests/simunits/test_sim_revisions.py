"""What tells two revisions apart on simulated units: tool calling and the answer's words.

Tool calls are read through the official client as well as raw, since a rollout's gate
parses them the way an application would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from loadtest.simunits import SimCluster
from loadtest.simunits.client import ControlClient, assemble_tool_calls, sse_data
from loadtest.simunits.toolcalls import PIECE_CHARS

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "near": {"type": ["number", "null"]},
    },
    "required": ["city"],
}
WEATHER_ARGS = {"city": "x", "days": 1, "metric": True, "unit": "c", "near": 1}
LOOKUP = {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}}}}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP}},
]
# The client's stream helper parses the arguments of `strict` tools only.
STRICT_TOOLS = [{**tool, "function": {**tool["function"], "strict": True}} for tool in TOOLS]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "weather in x?"}]}
ASK = {**CHAT, "tools": TOOLS}


def chat_url(cluster: SimCluster, index: int = 0) -> str:
    return cluster.units[index].leader_url + "/v1/chat/completions"


@pytest.fixture
async def openai_client(cluster: SimCluster) -> AsyncIterator[AsyncOpenAI]:
    client = AsyncOpenAI(base_url=cluster.units[0].leader_url + "/v1", api_key="x", max_retries=0)
    try:
        yield client
    finally:
        await client.close()


async def _whole(session: aiohttp.ClientSession, url: str, body: object) -> Any:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        return await resp.json()


async def _chunks(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    async with session.post(url, json={**body, "stream": True}) as resp:
        assert resp.status == 200
        raw = [data async for data in sse_data(resp)]
    assert raw[-1] == b"[DONE]"
    return [orjson.loads(data) for data in raw[:-1]]


async def test_tool_call_answer_through_the_official_client(openai_client: AsyncOpenAI) -> None:
    completion = await openai_client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == WEATHER_ARGS
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 1 + -(-len(call.function.arguments) // PIECE_CHARS)


async def test_streamed_tool_call_through_the_official_client(openai_client: AsyncOpenAI) -> None:
    async with openai_client.chat.completions.stream(
        model="m",
        messages=[{"role": "user", "content": "weather?"}],
        tools=STRICT_TOOLS,
        tool_choice={"type": "function", "function": {"name": "lookup"}},
    ) as stream:
        completion = await stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "lookup"
    assert json.loads(call.function.arguments) == {"ids": ["x"]}
    assert call.function.parsed_arguments == {"ids": ["x"]}


async def test_streamed_tool_call_wire_format(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    chunks = await _chunks(
        session, chat_url(cluster), {**ASK, "stream_options": {"include_usage": True}}
    )
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    first = deltas[1]["tool_calls"]
    assert first == [
        {
            "index": 0,
            "id": first[0]["id"],
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
    ]
    pieces = [d["tool_calls"][0] for d in deltas[2:-1]]
    assert len(pieces) > 1 and all(set(p) == {"index", "function"} for p in pieces)
    assert all(len(p["function"]["arguments"]) <= PIECE_CHARS for p in pieces)
    assert deltas[-1] == {} and chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == 1 + len(pieces)
    (call,) = assemble_tool_calls(chunks)
    assert json.loads(call["function"]["arguments"]) == WEATHER_ARGS
    whole = await _whole(session, chat_url(cluster), ASK)
    assert whole["choices"][0]["message"]["tool_calls"][0]["function"] == call["function"]


async def test_call_id_follows_the_request_id(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    ids = set()
    for request_id in ("a", "a", "b"):
        headers = {"x-request-id": request_id}
        async with session.post(chat_url(cluster), json=ASK, headers=headers) as resp:
            (call,) = (await resp.json())["choices"][0]["message"]["tool_calls"]
        ids.add((request_id, call["id"]))
    assert len(ids) == 2 and len({call_id for _, call_id in ids}) == 2  # "a" twice: one id


async def test_no_tool_call_when_tool_choice_is_none(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    whole = await _whole(session, chat_url(cluster), {**ASK, "tool_choice": "none"})
    choice = whole["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": "".join(f"tok{i} " for i in range(8)),
    }
    assert choice["finish_reason"] == "stop"


async def test_max_tokens_cuts_a_tool_call_short(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    whole = await _whole(session, chat_url(cluster), {**ASK, "max_tokens": 3})
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "length"
    arguments = choice["message"]["tool_calls"][0]["function"]["arguments"]
    assert len(arguments) == 2 * PIECE_CHARS
    assert whole["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tools": {}}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0].function.name"),
        ({"tools": [{"type": "code"}]}, "tools[0]"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ],
)
async def test_bad_tools_are_rejected(
    cluster: SimCluster, session: aiohttp.ClientSession, body: dict[str, object], field: str
) -> None:
    async with session.post(chat_url(cluster), json={**CHAT, **body}) as resp:
        assert resp.status == 400
        message = (await resp.json())["error"]["message"]
    assert message.startswith(f"{field}: ")


async def test_tools_text_answers_plain_text(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.settings("u0", tools="text")
    whole = await _whole(session, chat_url(cluster), ASK)
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"].startswith("tok0 ")
    chunks = await _chunks(session, chat_url(cluster), ASK)
    assert assemble_tool_calls(chunks) == []
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_tools_bad_json_breaks_the_arguments(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.settings("u0", tools="bad_json")
    whole = await _whole(session, chat_url(cluster), ASK)
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert call["function"]["name"] == "get_weather"
    (streamed,) = assemble_tool_calls(await _chunks(session, chat_url(cluster), ASK))
    assert streamed["function"] == call["function"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["function"]["arguments"])
    other = await _whole(session, chat_url(cluster, 1), ASK)  # the other unit still calls well
    json.loads(other["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])


async def _text(session: aiohttp.ClientSession, cluster: SimCluster, index: int) -> str:
    whole = await _whole(session, chat_url(cluster, index), {**CHAT, "temperature": 0})
    text: str = whole["choices"][0]["message"]["content"]
    return text


async def test_variant_changes_the_words_deterministically(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    baseline = await _text(session, cluster, 0)
    assert baseline == await _text(session, cluster, 1) == "".join(f"tok{i} " for i in range(8))
    for unit in ("u0", "u1"):
        await control.settings(unit, variant="r2")
    revised = await _text(session, cluster, 0)
    assert revised == await _text(session, cluster, 1) != baseline
    assert len(revised.split()) == 8
    streamed = await _chunks(session, chat_url(cluster, 1), CHAT)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in streamed) == revised
    await control.settings("u1", variant="r3")
    assert await _text(session, cluster, 1) not in (baseline, revised)
    await control.settings("u1", variant="")
    assert await _text(session, cluster, 1) == baseline
