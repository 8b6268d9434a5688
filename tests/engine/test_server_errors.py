"""Leader server, unhappy paths: 400s naming the parameter, 404 model, engine refusals and
failures (before and after the first byte), client disconnects, health status mapping."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import openai
import pytest

from engine.scheduler import InvalidParams, PromptTooLong
from tests.engine.test_server_double import (
    MODEL,
    FakeEngine,
    chat_body,
    chunks,
    completion_body,
    post,
    served,
    sse_events,
)

CHAT_CASES: list[tuple[dict[str, Any], str]] = [
    ({"messages": None}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x" * 100}]}, "messages"),
    ({"model": None}, "model"),
    ({"temperature": 3}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": []}, "stream_options"),
    ({"stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
    ({"stop": 5}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["a", 1]}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"seed": 1.5}, "seed"),
    ({"ignore_eos": "no"}, "ignore_eos"),
    ({"return_token_ids": 1}, "return_token_ids"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": "1"}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {"65": 101}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"priority": 1.5}, "priority"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        "structured_outputs",
    ),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tool_choice": "required"}, "tool_choice"),
]
COMPLETION_CASES: list[tuple[dict[str, Any], str]] = [
    ({"prompt": None}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1], [2]]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, -1]}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({"prompt": "x" * 100}, "prompt"),
    ({"echo": True}, "echo"),
    ({"best_of": 3}, "best_of"),
]


@pytest.fixture
async def url() -> Any:
    async with served(FakeEngine()) as base:
        yield base


@pytest.mark.parametrize(("extra", "param"), CHAT_CASES)
async def test_chat_bad_input_is_400_naming_param(
    url: str, extra: dict[str, Any], param: str
) -> None:
    status, body = await post(f"{url}/v1/chat/completions", chat_body(**extra))
    assert status == 400, body
    assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error"
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


@pytest.mark.parametrize(("extra", "param"), COMPLETION_CASES)
async def test_completion_bad_input_is_400_naming_param(
    url: str, extra: dict[str, Any], param: str
) -> None:
    status, body = await post(f"{url}/v1/completions", completion_body(**extra))
    assert status == 400, body
    assert body["error"]["param"] == param


async def test_prompt_too_long_says_context_length(url: str) -> None:
    status, body = await post(f"{url}/v1/completions", completion_body(prompt=[1] * 64))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    status, _ = await post(f"{url}/v1/completions", completion_body(prompt=[1] * 63))
    assert status == 200  # one token of room is enough


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff"])
async def test_unparseable_body_is_400(url: str, raw: bytes) -> None:
    status, body = await post(f"{url}/v1/chat/completions", raw)
    assert status == 400 and body["error"]["param"] is None


async def test_unknown_model_is_404(url: str) -> None:
    status, body = await post(f"{url}/v1/chat/completions", chat_body(model="other"))
    assert status == 404
    assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"


@pytest.mark.parametrize(
    ("refusal", "param"),
    [(InvalidParams("seed", -1, "must be >= 0"), "seed"), (PromptTooLong(0, 60, 50), "prompt")],
)
async def test_engine_refusal_is_400(refusal: Exception, param: str) -> None:
    async with served(FakeEngine(refuse=refusal)) as url:
        status, body = await post(f"{url}/v1/completions", completion_body(stream=True))
    assert status == 400 and body["error"]["param"] == param


async def wait_for_abort(engine: FakeEngine, deadline_s: float) -> float:
    start = time.monotonic()
    while not engine.aborts and time.monotonic() - start < deadline_s:
        await asyncio.sleep(0.002)
    return time.monotonic() - start


async def test_stream_disconnect_aborts_within_100ms() -> None:
    engine = FakeEngine(hang_after=2)
    async with served(engine) as url, aiohttp.ClientSession() as session:
        body = chat_body(stream=True)
        response = await session.post(f"{url}/v1/chat/completions", json=body)
        for _ in range(3):  # role chunk, then two tokens
            await response.content.readuntil(b"\n\n")
        response.close()
        waited = await wait_for_abort(engine, 1.0)
    assert engine.aborts == [engine.requests[0].request_id]
    assert waited < 0.1


async def test_non_streaming_disconnect_aborts_within_100ms() -> None:
    engine = FakeEngine(hang_after=0)
    async with served(engine) as url, aiohttp.ClientSession() as session:
        request = asyncio.create_task(session.post(f"{url}/v1/completions", json=completion_body()))
        while not engine.requests:
            await asyncio.sleep(0.002)
        request.cancel()
        waited = await wait_for_abort(engine, 1.0)
    assert engine.aborts == [engine.requests[0].request_id] and waited < 0.1


async def test_engine_error_mid_stream_is_error_event_without_done() -> None:
    async with served(FakeEngine(fail_after=2)) as url:
        _, events = await sse_events(f"{url}/v1/chat/completions", chat_body(stream=True))
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        stream = await client.completions.create(model=MODEL, prompt="hi", stream=True)
        with pytest.raises(openai.APIError, match="follower 1 died"):
            async for _ in stream:
                pass
        await client.close()
    assert "[DONE]" not in events
    *data, last = chunks(events)
    assert [c["choices"][0]["delta"].get("content") for c in data] == ["", "Hel", "lo"]
    assert last == {
        "error": {
            "message": "follower 1 died",
            "type": "service_unavailable",
            "param": None,
            "code": "engine_error",
        }
    }


@pytest.mark.parametrize("stream", [True, False])
async def test_engine_error_before_first_byte_is_503(stream: bool) -> None:
    engine = FakeEngine(fail_after=0)
    async with served(engine) as url:
        status, body = await post(f"{url}/v1/chat/completions", chat_body(stream=stream))
    assert status == 503 and body["error"]["message"] == "follower 1 died"
    assert engine.aborts == []  # the engine already ended it


async def test_engine_error_mid_non_stream_is_503() -> None:
    async with served(FakeEngine(fail_after=3)) as url:
        status, body = await post(f"{url}/v1/completions", completion_body())
    assert status == 503 and body["error"]["code"] == "engine_error"


async def test_reused_request_id_gets_distinct_engine_ids() -> None:
    engine = FakeEngine(hang_after=1)
    async with served(engine) as url:
        headers = {"x-request-id": "same"}
        calls = [post(f"{url}/v1/completions", completion_body(), headers) for _ in range(2)]
        tasks = [asyncio.create_task(c) for c in calls]
        while len(engine.requests) < 2:
            await asyncio.sleep(0.002)
        ids = [r.request_id for r in engine.requests]
        for rid in ids:
            engine.abort(rid)
        await asyncio.gather(*tasks)
    assert ids[0] == "same" and ids[1].startswith("same-")


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"status": "ok", "role": "leader", "step": 3}, 200),
        ({"status": "degraded", "role": "leader"}, 503),
        ({"raise": RuntimeError("boom")}, 503),
    ],
)
async def test_health_maps_status_to_http(fields: dict[str, Any], code: int) -> None:
    async with (
        served(FakeEngine(health=fields)) as url,
        aiohttp.ClientSession() as session,
        session.get(f"{url}/health") as response,
    ):
        body = await response.json()
    assert response.status == code
    if "raise" not in fields:
        assert body == fields
    else:
        assert body["status"] == "error" and "boom" in body["error"]
