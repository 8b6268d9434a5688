"""The leader's HTTP server over the real engine (world size 1): a client that disconnects
mid-stream has its sequence aborted in the scheduler and its KV slot freed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from engine.model import ByteTokenizer, ModelConfig, init_from_seed
from engine.runtime.leader import LeaderEngine
from engine.server import build_app

SLOTS = 2


@pytest.fixture
async def served() -> AsyncIterator[tuple[LeaderEngine, str]]:
    config = replace(ModelConfig.tiny(), max_seq_len=512)
    engine = LeaderEngine(
        init_from_seed(config, seed=0, num_slots=SLOTS), ByteTokenizer(), model_name="tiny"
    ).start()
    runner = web.AppRunner(build_app(engine), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield engine, f"http://{host}:{port}"
    finally:
        await runner.cleanup()
        await asyncio.to_thread(engine.shutdown)


async def test_disconnect_frees_the_kv_slot(served: tuple[LeaderEngine, str]) -> None:
    engine, url = served
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "max_tokens": 400,
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession() as client:
        resp = await client.post(url + "/v1/chat/completions", json=body)
        assert resp.status == 200
        await resp.content.readany()  # generation is under way
        assert engine.scheduler.free_slots == SLOTS - 1
        resp.connection.transport.abort()  # type: ignore[union-attr]
        resp.close()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while engine.scheduler.free_slots != SLOTS:
        assert loop.time() < deadline, "the aborted sequence still holds its slot"
        await asyncio.sleep(0.01)
    assert engine.health()["pending"] == 0


async def test_full_answer_through_http(served: tuple[LeaderEngine, str]) -> None:
    _, url = served
    body = {
        "model": "tiny",
        "prompt": [1, 2, 3],
        "max_tokens": 5,
        "ignore_eos": True,
        "temperature": 0,
        "return_token_ids": True,
    }
    async with (
        aiohttp.ClientSession() as client,
        client.post(url + "/v1/completions", json=body) as resp,
    ):
        payload = await resp.json()
    assert resp.status == 200, payload
    assert len(payload["choices"][0]["token_ids"]) == 5
    assert payload["usage"]["completion_tokens"] == 5


async def test_prompt_ids_are_bounded_by_the_model_not_the_tokenizer(
    served: tuple[LeaderEngine, str],
) -> None:
    """The tiny model's vocabulary (512) is larger than the byte tokenizer's (262): ids it
    generates past the tokenizer come back as prompt when the gateway resumes a stream."""
    _, url = served
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0}
    async with aiohttp.ClientSession() as client:
        async with client.post(url + "/v1/completions", json={**body, "prompt": [1, 400]}) as ok:
            assert ok.status == 200, await ok.text()
        async with client.post(url + "/v1/completions", json={**body, "prompt": [1, 512]}) as bad:
            assert bad.status == 400
            assert (await bad.json())["error"]["param"] == "prompt"
