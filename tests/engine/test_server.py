"""Leader server, happy paths: OpenAI wire format for chat and completions, streamed or not,
as seen raw and through the official `openai` client."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from engine.scheduler import SamplingParams
from engine.server import serve
from tests.engine.test_server_double import (
    CHAT_PROMPT,
    COMPLETION_PROMPT,
    EOS,
    MODEL,
    SCRIPT,
    TEXT,
    TOKENIZER,
    FakeEngine,
    chat_body,
    chunks,
    completion_body,
    post,
    served,
    sse_events,
)

SCRIPT_IDS = [token for token, _ in SCRIPT]


async def test_chat_non_streaming_body() -> None:
    engine = FakeEngine()
    async with served(engine) as url:
        headers = {"x-request-id": "req-1"}
        status, body = await post(f"{url}/v1/chat/completions", chat_body(), headers)
    assert status == 200
    assert body["id"] == "chatcmpl-req-1" and body["object"] == "chat.completion"
    assert body["model"] == MODEL and abs(body["created"] - time.time()) < 5
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": TEXT}
    assert choice["finish_reason"] == "stop" and choice["index"] == 0
    completion = len(SCRIPT) + 1  # EOS counts
    usage = {"prompt_tokens": len(CHAT_PROMPT), "completion_tokens": completion}
    details = {"prompt_tokens_details": {"cached_tokens": 0}}  # this engine caches nothing
    total = len(CHAT_PROMPT) + completion
    assert body["usage"] == {**usage, "total_tokens": total, **details}
    assert "prompt_token_ids" not in body and "token_ids" not in choice
    assert engine.requests[0].request_id == "req-1"
    assert engine.requests[0].prompt_ids == tuple(CHAT_PROMPT)
    assert engine.aborts == []


async def test_chat_stream_wire_format() -> None:
    engine = FakeEngine()
    async with served(engine) as url:
        response, events = await sse_events(f"{url}/v1/chat/completions", chat_body(stream=True))
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    body = chunks(events)
    assert {c["id"] for c in body} == {"chatcmpl-" + response.headers["x-request-id"]}
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in body)
    assert body[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"].get("content") for c in body[1:-1]]
    assert contents == ["Hel", "lo", " world", "!"]  # the empty delta is not sent
    assert body[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert engine.aborts == []


async def test_stream_include_usage() -> None:
    async with served(FakeEngine()) as url:
        body = chat_body(stream=True, stream_options={"include_usage": True}, max_tokens=2)
        _, events = await sse_events(f"{url}/v1/chat/completions", body)
    parsed = chunks(events)
    assert all(c["usage"] is None for c in parsed[:-1])
    assert parsed[-2]["choices"][0]["finish_reason"] == "length"
    assert parsed[-1]["choices"] == []
    total = len(CHAT_PROMPT) + 2
    assert parsed[-1]["usage"] == {
        "prompt_tokens": len(CHAT_PROMPT),
        "completion_tokens": 2,
        "total_tokens": total,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert events[-1] == "[DONE]"


async def test_completions_non_streaming_and_streaming() -> None:
    engine = FakeEngine()
    async with served(engine) as url:
        status, body = await post(f"{url}/v1/completions", completion_body(max_tokens=2))
        _, events = await sse_events(f"{url}/v1/completions", completion_body(stream=True))
    assert status == 200 and body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-") and "system_fingerprint" not in body
    assert body["choices"] == [
        {"index": 0, "text": "Hello", "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"]["completion_tokens"] == 2
    parsed = chunks(events)
    assert all(c["object"] == "text_completion" for c in parsed)
    assert "".join(c["choices"][0]["text"] for c in parsed) == TEXT
    assert parsed[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1] == "[DONE]"
    # a string prompt is encoded with BOS, as vLLM does
    assert engine.requests[0].prompt_ids == tuple(COMPLETION_PROMPT)


@pytest.mark.parametrize("prompt", [[5, 6, 7], [[5, 6, 7]]])
async def test_token_id_prompt_is_used_as_is(prompt: list[object]) -> None:
    engine = FakeEngine()
    async with served(engine) as url:
        status, body = await post(f"{url}/v1/completions", completion_body(prompt=prompt))
    assert status == 200 and body["usage"]["prompt_tokens"] == 3
    assert engine.requests[0].prompt_ids == (5, 6, 7)


async def test_return_token_ids_streaming() -> None:
    async with served(FakeEngine()) as url:
        _, chat = await sse_events(
            f"{url}/v1/chat/completions", chat_body(stream=True, return_token_ids=True)
        )
        _, completion = await sse_events(
            f"{url}/v1/completions", completion_body(stream=True, return_token_ids=True)
        )
    chat_chunks = chunks(chat)
    assert chat_chunks[0]["prompt_token_ids"] == CHAT_PROMPT  # top level, first chunk only
    assert all("prompt_token_ids" not in c for c in chat_chunks[1:])
    ids = [t for c in chat_chunks for t in c["choices"][0].get("token_ids", [])]
    assert ids == [*SCRIPT_IDS, EOS]
    silent = [c for c in chat_chunks if c["choices"][0].get("token_ids") == [7]]
    assert silent[0]["choices"][0]["delta"] == {"content": ""}  # sent for its token id
    comp_chunks = chunks(completion)
    assert comp_chunks[0]["choices"][0]["prompt_token_ids"] == COMPLETION_PROMPT  # on the choice
    ids = [t for c in comp_chunks for t in c["choices"][0]["token_ids"]]
    assert ids == [*SCRIPT_IDS, EOS]


async def test_return_token_ids_non_streaming() -> None:
    async with served(FakeEngine()) as url:
        _, chat = await post(f"{url}/v1/chat/completions", chat_body(return_token_ids=True))
        _, comp = await post(f"{url}/v1/completions", completion_body(return_token_ids=True))
    assert chat["prompt_token_ids"] == CHAT_PROMPT
    assert chat["choices"][0]["token_ids"] == [*SCRIPT_IDS, EOS]
    assert comp["choices"][0]["prompt_token_ids"] == COMPLETION_PROMPT
    assert comp["choices"][0]["token_ids"] == [*SCRIPT_IDS, EOS]


async def test_sampling_params_pass_through() -> None:
    engine = FakeEngine()
    extra = {"temperature": 0.5, "top_p": 0.9, "seed": 7, "ignore_eos": True}
    async with served(engine) as url:
        await post(f"{url}/v1/chat/completions", chat_body(stop="x", max_tokens=3, **extra))
        body = chat_body(stop=["a", "b"], max_tokens=9, max_completion_tokens=4)
        await post(f"{url}/v1/chat/completions", body | {"stop_token_ids": [9]})
        await post(f"{url}/v1/chat/completions", chat_body())
        await post(f"{url}/v1/completions", completion_body())
    first, second, chat_default, completion_default = (r.params for r in engine.requests)
    assert first == SamplingParams(
        max_tokens=3, temperature=0.5, top_p=0.9, seed=7, stop=("x",), ignore_eos=True
    )
    assert second == SamplingParams(max_tokens=4, stop=("a", "b"), stop_token_ids=(9,))
    assert chat_default.max_tokens == engine.max_seq_len - len(CHAT_PROMPT)  # rest of context
    assert completion_default.max_tokens == 16  # OpenAI's completions default


async def test_models_endpoint() -> None:
    async with (
        served(FakeEngine()) as url,
        aiohttp.ClientSession() as session,
        session.get(f"{url}/v1/models") as response,
    ):
        body = await response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL]


async def test_openai_client_chat_and_completions() -> None:
    async with served(FakeEngine()) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        chat = await client.chat.completions.create(model=MODEL, messages=messages)
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts = [c async for c in stream]
        completion = await client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        comp_stream = await client.completions.create(model=MODEL, prompt=[1, 2], stream=True)
        comp_parts = [c async for c in comp_stream]
        extra = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            extra_body={"return_token_ids": True},
        )
        models = await client.models.list()
        await client.close()
    assert chat.choices[0].message.content == TEXT and chat.choices[0].finish_reason == "stop"
    assert chat.usage is not None and chat.usage.completion_tokens == len(SCRIPT) + 1
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == TEXT
    assert parts[-1].usage is not None and parts[-1].usage.prompt_tokens == len(CHAT_PROMPT)
    assert completion.choices[0].text == "Hello" and completion.choices[0].finish_reason == "length"
    assert "".join(p.choices[0].text for p in comp_parts) == TEXT
    assert extra.model_extra is not None and extra.model_extra["prompt_token_ids"] == CHAT_PROMPT
    assert [m.id for m in models.data] == [MODEL]


async def test_serve_helper_reports_port_and_stops_on_cancel() -> None:
    ports: asyncio.Queue[int] = asyncio.Queue()
    task = asyncio.create_task(serve(FakeEngine(), "127.0.0.1", 0, ports.put_nowait))
    port = await asyncio.wait_for(ports.get(), 5)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/health") as response,
    ):
        assert response.status == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_chat_text_parts_and_developer_role() -> None:
    engine = FakeEngine()
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    async with served(engine) as url:
        status, _ = await post(f"{url}/v1/chat/completions", chat_body(messages=messages))
    assert status == 200
    expected = TOKENIZER.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"}]
    )
    assert engine.requests[0].prompt_ids == tuple(expected)
