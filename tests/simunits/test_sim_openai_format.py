"""The leader's OpenAI surface, checked event by event and through the official client."""

from __future__ import annotations

import time

import aiohttp
import orjson
from openai import AsyncOpenAI

from loadtest.simunits import Settings, SimCluster
from loadtest.simunits.client import ControlClient, sse_data

TOKENS = [f"tok{i} " for i in range(100)]
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "say three words"}]}


async def _events(session: aiohttp.ClientSession, url: str, body: object) -> list[bytes]:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Transfer-Encoding"] == "chunked"
        return [data async for data in sse_data(resp)]


async def test_chat_stream_format(cluster: SimCluster, session: aiohttp.ClientSession) -> None:
    body = {**CHAT, "stream": True, "max_tokens": 5, "stream_options": {"include_usage": True}}
    raw = await _events(session, cluster.units[0].leader_url + "/v1/chat/completions", body)
    assert raw[-1] == b"[DONE]"
    chunks = [orjson.loads(r) for r in raw[:-1]]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m1" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [c["choices"][0]["delta"]["content"] for c in chunks[1:6]]
    assert texts == [f"tok{i} " for i in range(5)]
    assert chunks[6]["choices"][0]["delta"] == {}
    assert chunks[6]["choices"][0]["finish_reason"] == "length"
    assert chunks[7]["choices"] == []
    assert chunks[7]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert len(chunks) == 8


async def test_stream_without_max_tokens_stops(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    raw = await _events(
        session, cluster.units[1].leader_url + "/v1/chat/completions", {**CHAT, "stream": True}
    )
    chunks = [orjson.loads(r) for r in raw[:-1]]
    assert len(chunks) == 1 + 8 + 1  # role, default 8 tokens, finish
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in chunks)


async def test_completions_stream(cluster: SimCluster, session: aiohttp.ClientSession) -> None:
    body = {"model": "m1", "prompt": "a b", "max_tokens": 3, "stream": True}
    raw = await _events(session, cluster.units[0].leader_url + "/v1/completions", body)
    chunks = [orjson.loads(r) for r in raw[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["tok0 ", "tok1 ", "tok2 ", ""]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[0]["id"].startswith("cmpl-")


async def test_non_streaming_chat(cluster: SimCluster, session: aiohttp.ClientSession) -> None:
    url = cluster.units[0].leader_url + "/v1/chat/completions"
    async with session.post(url, json=CHAT, headers={"x-request-id": "abc"}) as resp:
        assert resp.status == 200
        result = await resp.json()
    assert result["id"] == "chatcmpl-abc"
    assert result["object"] == "chat.completion"
    choice = result["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "".join(TOKENS[:8])}
    assert choice["finish_reason"] == "stop"
    assert result["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 8,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_non_streaming_completion_is_capped() -> None:
    async with (
        SimCluster(units=1, followers=0, settings=Settings(0, 0), max_tokens_cap=3) as capped,
        aiohttp.ClientSession() as session,
    ):
        body = {"model": "m1", "prompt": ["one two", "three"], "max_tokens": 1000}
        async with session.post(capped.units[0].leader_url + "/v1/completions", json=body) as resp:
            result = await resp.json()
    assert result["object"] == "text_completion"
    assert result["choices"][0]["text"] == "tok0 tok1 tok2 "
    assert result["choices"][0]["finish_reason"] == "stop"  # the cap, not max_tokens, ended it
    assert result["usage"]["prompt_tokens"] == 3


async def test_same_request_id_gives_identical_bytes(
    cluster: SimCluster, session: aiohttp.ClientSession
) -> None:
    url = cluster.units[0].leader_url + "/v1/chat/completions"
    bodies = []
    for _ in range(2):
        async with session.post(
            url, json={**CHAT, "stream": True}, headers={"x-request-id": "r-1"}
        ) as resp:
            bodies.append(await resp.read())
    assert bodies[0] == bodies[1]
    assert b'"id":"chatcmpl-r-1"' in bodies[0]


async def test_bad_requests(cluster: SimCluster, session: aiohttp.ClientSession) -> None:
    url = cluster.units[0].leader_url + "/v1/chat/completions"
    async with session.post(url, data=b"{nope") as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}
    async with session.post(url, json={"model": "m"}) as resp:
        assert resp.status == 400
        assert "messages" in (await resp.json())["error"]["message"]


async def test_models(cluster: SimCluster, session: aiohttp.ClientSession) -> None:
    async with session.get(cluster.units[0].leader_url + "/v1/models") as resp:
        models = await resp.json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "unitgate-sim"
    assert models["data"][0]["owned_by"] == "unitgate-sim"


async def test_official_client_streams(cluster: SimCluster) -> None:
    client = AsyncOpenAI(base_url=cluster.units[0].leader_url + "/v1", api_key="x", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model="m1",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            usage = chunk.usage or usage
        completion = await client.completions.create(model="m1", prompt="x", max_tokens=2)
    finally:
        await client.close()
    assert text == "tok0 tok1 tok2 tok3 "
    assert usage is not None and usage.completion_tokens == 4
    assert completion.choices[0].text == "tok0 tok1 "


async def test_latency_settings_are_honoured(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.settings("u0", ttft_ms=80, itl_ms=20)
    body = {**CHAT, "stream": True, "max_tokens": 4}
    start = time.monotonic()
    arrivals = []
    async with session.post(
        cluster.units[0].leader_url + "/v1/chat/completions", json=body
    ) as resp:
        async for data in sse_data(resp):
            if b'"content":"tok' in data:
                arrivals.append(time.monotonic() - start)
    assert arrivals[0] >= 0.08
    assert arrivals[-1] - arrivals[0] >= 3 * 0.02 * 0.9
    assert arrivals[-1] < 5.0
