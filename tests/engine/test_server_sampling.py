"""The leader's sampling fields end to end, over the real engine (a seeded tiny model, one
node): logprobs in OpenAI's shapes, n choices from one prefill, seeds that do not depend on
the batch, logit_bias, and priority ordering the queue."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from engine.model import ByteTokenizer, ModelConfig, init_from_seed
from engine.runtime.leader import LeaderEngine
from tests.engine.test_server_double import chunks, post, served, sse_events

MODEL = "tiny"
SLOTS = 4
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
Served = tuple[LeaderEngine, str]


def start_engine(slots: int = SLOTS) -> LeaderEngine:
    config = replace(ModelConfig.tiny(), max_seq_len=1024)
    model = init_from_seed(config, seed=0, num_slots=slots)
    return LeaderEngine(model, ByteTokenizer(), model_name=MODEL).start()


@pytest.fixture
async def unit() -> AsyncIterator[Served]:
    engine = start_engine()
    try:
        async with served(engine) as url:
            yield engine, url
    finally:
        await asyncio.to_thread(engine.shutdown)


def chat(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


async def ok(url: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = await post(url, body)
    assert status == 200, answer
    return answer


def check_entry(entry: dict[str, Any], k: int) -> None:
    """One token's logprob entry: a log of a probability, its bytes, a sorted top list that
    holds the sampled token."""
    assert entry["logprob"] <= 0 and math.isfinite(entry["logprob"])
    assert bytes(entry["bytes"]).decode("utf-8", errors="replace") == entry["token"]
    top = entry["top_logprobs"]
    assert k <= len(top) <= k + 1
    values = [t["logprob"] for t in top]
    assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
    assert (entry["token"], entry["logprob"]) in [(t["token"], t["logprob"]) for t in top]


@pytest.mark.parametrize("temperature", [0, 1])
async def test_chat_logprobs_whole_and_streamed(unit: Served, temperature: float) -> None:
    _, url = unit
    body = chat(logprobs=True, top_logprobs=3, max_tokens=6, temperature=temperature, seed=1)
    body["ignore_eos"] = True
    answer = await ok(url + CHAT, body)
    entries = answer["choices"][0]["logprobs"]["content"]
    assert len(entries) == 6
    for entry in entries:
        check_entry(entry, 3)
        if temperature == 0:  # greedy: the sampled token is the most likely one
            assert entry["logprob"] == entry["top_logprobs"][0]["logprob"]
    _, events = await sse_events(url + CHAT, {**body, "stream": True})
    streamed = [
        e
        for c in chunks(events)
        for ch in c["choices"]
        if ch["logprobs"]
        for e in ch["logprobs"]["content"]
    ]
    assert streamed == entries  # the same seed, the same tokens and numbers


async def test_chat_logprobs_without_top_logprobs_list_no_alternatives(unit: Served) -> None:
    _, url = unit
    answer = await ok(url + CHAT, chat(logprobs=True, max_tokens=3, ignore_eos=True))
    entries = answer["choices"][0]["logprobs"]["content"]
    assert len(entries) == 3
    assert all(e["top_logprobs"] == [] and e["logprob"] <= 0 for e in entries)


async def test_completion_logprobs_shape(unit: Served) -> None:
    _, url = unit
    body = {"model": MODEL, "prompt": "shoes", "max_tokens": 5, "logprobs": 2}
    answer = await ok(url + COMPLETIONS, {**body, "temperature": 0, "ignore_eos": True})
    choice = answer["choices"][0]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 5
    for token, value, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert value <= 0 and top[token] == value and max(top.values()) == value
    offsets = logprobs["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0


async def test_n_choices_share_the_prompt_and_count_it_once(unit: Served) -> None:
    engine, url = unit
    body = chat(n=2, temperature=1, max_tokens=8, ignore_eos=True, seed=11)
    answer = await ok(url + CHAT, body)
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[0]["message"]["content"] != choices[1]["message"]["content"]
    prompt = len(ByteTokenizer().apply_chat_template([{"role": "user", "content": "hi"}]))
    assert answer["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 16,
        "total_tokens": prompt + 16,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    _, events = await sse_events(url + CHAT, {**body, "stream": True})
    texts = ["", ""]
    for chunk in chunks(events):
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
    assert texts == [c["message"]["content"] for c in choices]  # seed + index per choice
    assert engine.scheduler.free_slots == SLOTS


async def test_n_beyond_the_units_slots_is_refused(unit: Served) -> None:
    _, url = unit
    status, answer = await post(url + CHAT, chat(n=SLOTS + 1))
    assert status == 400 and answer["error"]["param"] == "n", answer
    assert "KV slots" in answer["error"]["message"]


async def test_a_seed_gives_the_same_text_whatever_else_is_in_the_batch(unit: Served) -> None:
    _, url = unit
    body = chat("a seeded answer", temperature=1, seed=1234, max_tokens=24, ignore_eos=True)
    alone = (await ok(url + CHAT, body))["choices"][0]["message"]["content"]
    others = [
        chat(f"neighbour {i}", temperature=1, max_tokens=40, ignore_eos=True) for i in range(3)
    ]
    answers = await asyncio.gather(
        *(ok(url + CHAT, other) for other in others), ok(url + CHAT, body)
    )
    assert answers[-1]["choices"][0]["message"]["content"] == alone


async def test_logit_bias_of_100_forces_the_token(unit: Served) -> None:
    _, url = unit
    body = chat(logit_bias={"65": 100}, temperature=1, max_tokens=5, ignore_eos=True)
    answer = await ok(url + CHAT, body)
    assert answer["choices"][0]["message"]["content"] == "AAAAA"
    body = chat(logit_bias={"65": -100}, temperature=0, max_tokens=30, ignore_eos=True)
    answer = await ok(url + CHAT, {**body, "logprobs": True, "top_logprobs": 5})
    assert all(e["token"] != "A" for e in answer["choices"][0]["logprobs"]["content"])


async def test_priority_serves_the_urgent_request_first_and_preempts_at_full_batch() -> None:
    """One slot: a long low-priority answer is running; an urgent request preempts it and
    finishes first, and the preempted answer (greedy, recomputed) is what it would have been."""
    engine = start_engine(slots=1)
    try:
        async with served(engine) as url:
            slow = chat("long", temperature=0, max_tokens=300, ignore_eos=True, priority=10)
            alone = (await ok(url + CHAT, slow))["choices"][0]["message"]["content"]
            order: list[str] = []

            async def run(name: str, body: dict[str, Any]) -> str:
                answer = await ok(url + CHAT, body)
                order.append(name)
                return str(answer["choices"][0]["message"]["content"])

            low = asyncio.create_task(run("low", slow))
            deadline = asyncio.get_running_loop().time() + 10
            while engine.scheduler.num_running == 0:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.005)
            urgent = chat("now", temperature=0, max_tokens=4, ignore_eos=True, priority=-1)
            await run("urgent", urgent)
            assert await low == alone
            assert order == ["urgent", "low"]
    finally:
        await asyncio.to_thread(engine.shutdown)
