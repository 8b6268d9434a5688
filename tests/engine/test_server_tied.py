"""Tied requests over the real engine (world size 1, one KV slot, steps slowed to 40 ms):
a request marked `x-unitgate-tied: 1` gets its answer's head when the engine starts it, not
while it waits for a slot, and a step before its first token; one whose client leaves while it
waits is never started; the leader says in its health that it ties. And the engine's side:
`STARTED` once, before the first token, only for a request that asked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from engine.api import STARTED, GenerationRequest
from engine.runtime.leader import LeaderEngine
from engine.scheduler import SamplingParams
from tests.leader_support import tiny_leaders

STEP_S = 0.04
CHAT = "/v1/chat/completions"
TIED = {"x-unitgate-tied": "1"}


def body(max_tokens: int, content: str = "hello") -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


@pytest.fixture
async def served() -> AsyncIterator[tuple[LeaderEngine, str]]:
    async with tiny_leaders(1, slots=1, model="tiny", step_s=STEP_S) as leaders:
        yield leaders[0]


async def until(check: Any, within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.01)


async def test_a_tied_requests_head_comes_when_it_starts_before_its_first_token(
    served: tuple[LeaderEngine, str],
) -> None:
    engine, url = served
    assert engine.health()["tied_requests"] is True
    async with aiohttp.ClientSession() as client:
        hog = await client.post(url + CHAT, json=body(400))  # holds the one slot
        await hog.content.readany()
        tied = asyncio.ensure_future(client.post(url + CHAT, json=body(3, "hi"), headers=TIED))
        await asyncio.sleep(6 * STEP_S)
        assert not tied.done(), "a tied request's head came while it waited for a slot"
        hog.connection.transport.abort()  # type: ignore[union-attr]
        hog.close()
        resp = await asyncio.wait_for(tied, 5.0)
        head_at = time.monotonic()
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        first = await resp.content.readany()
        gap = time.monotonic() - head_at
        assert first.startswith(b"data: ")
        assert gap >= STEP_S / 2, f"the first token came {gap * 1000:.0f} ms after the head"
        rest = first + await resp.content.read()
        assert rest.endswith(b"data: [DONE]\n\n")
        assert b'"finish_reason":"length"' in rest


async def test_a_tied_request_whose_client_leaves_while_it_waits_never_starts(
    served: tuple[LeaderEngine, str],
) -> None:
    engine, url = served
    async with aiohttp.ClientSession() as client:
        hog = await client.post(url + CHAT, json=body(400))
        await hog.content.readany()
        queried = engine.health()["prefix_cache_queries"]
        tied = asyncio.ensure_future(client.post(url + CHAT, json=body(3, "hi"), headers=TIED))
        await until(lambda: engine.health()["pending"] == 2, 5.0, "the tied request queued")
        tied.cancel()  # the gateway closes the twin's connection
        await until(lambda: engine.health()["pending"] == 1, 5.0, "the twin's request aborted")
        hog.connection.transport.abort()  # type: ignore[union-attr]
        hog.close()
        await until(lambda: engine.scheduler.free_slots == 1, 5.0, "the slot freed")
        await asyncio.sleep(4 * STEP_S)
        assert engine.health()["prefix_cache_queries"] == queried, "the twin was prefilled"
        assert engine.health()["pending"] == 0


async def test_the_engine_yields_started_once_before_the_first_token_only_when_asked(
    served: tuple[LeaderEngine, str],
) -> None:
    engine, _ = served
    prompt = tuple(engine.tokenizer.encode("hello"))
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    for asked in (True, False):
        request = GenerationRequest(f"r-{asked}", prompt, params, announce_start=asked)
        events = [event async for event in engine.generate(request)]
        starts = [i for i, event in enumerate(events) if event is STARTED]
        assert starts == ([0] if asked else [])
        assert sum(e.token_id is not None for e in events) == 3


async def test_a_request_of_two_choices_is_announced_once() -> None:
    async with tiny_leaders(1, slots=2, model="tiny") as [(engine, _)]:
        prompt = tuple(engine.tokenizer.encode("hello"))
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        request = GenerationRequest("r-n2", prompt, params, n=2, announce_start=True)
        events = [event async for event in engine.generate(request)]
        assert [i for i, event in enumerate(events) if event is STARTED] == [0]
        assert sum(e.token_id is not None for e in events) == 6
