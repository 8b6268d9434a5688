"""A real unit: the leader in this process, followers as
`python -m engine.backends.builtin.bare` subprocesses, one Gloo group over 127.0.0.1, as
tensor parallelism and as pipeline stages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from engine.api import GenerationRequest, TokenEvent
from engine.model import ByteTokenizer, ModelConfig, init_from_seed
from engine.runtime import LeaderEngine
from engine.scheduler import SamplingParams
from tests.engine.test_runtime_support import (
    MAX_SEQ_LEN,
    PROMPT,
    Node,
    get_health,
    kill_all,
    start_unit,
)

pytestmark = pytest.mark.slow
LONG_PROMPT = tuple(range(1, 257)) * 4 + PROMPT  # > FRAME_SIZE tokens: two broadcasts
CHUNK = 100  # the unit's prefill chunk: a long prompt takes 11 steps, its last chunk short


@pytest.fixture(scope="module", params=[(), ("--pp", "2")], ids=["tp2", "pp2"])
def unit(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[LeaderEngine, Node]]:
    """Two nodes as tensor parallelism, then as two pipeline stages (the leader keeping
    micro-batches of the running sequences in flight): every test runs on both."""
    flags = ("--prefill-chunk", str(CHUNK))
    shape: tuple[str, ...] = request.param
    engine, follower = start_unit(tmp_path_factory.mktemp("unit"), 10.0, *flags, shape=shape)
    try:
        yield engine, follower
        engine.shutdown(timeout=10)
        assert follower.wait(10) == 0, follower.log()  # STOP -> follower exits cleanly
    finally:
        kill_all(follower)


async def collect(
    engine: LeaderEngine, rid: str, prompt: tuple[int, ...] = PROMPT, **params: object
) -> list[TokenEvent]:
    request = GenerationRequest(rid, prompt, SamplingParams(**params))  # type: ignore[arg-type]
    return [event async for event in engine.generate(request)]


def token_ids(events: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in events if e.token_id is not None]


def unchunked() -> LeaderEngine:
    """The same model at world size 1, every prompt prefilled in one step."""
    config = replace(ModelConfig.tiny(), max_seq_len=MAX_SEQ_LEN)
    model = init_from_seed(config, seed=0, num_slots=4)
    return LeaderEngine(model, ByteTokenizer(), model_name="t", prefill_chunk=MAX_SEQ_LEN)


@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "overflows-frame"])
async def test_two_nodes_greedy_match_world_size_1(
    unit: tuple[LeaderEngine, Node], prompt: tuple[int, ...]
) -> None:
    """The long prompt is also prefilled in chunks by the unit and in one step by the
    reference: the follower runs every chunk as the leader does."""
    engine, _ = unit
    single = unchunked().start()
    try:
        want = await collect(single, "w1", prompt, temperature=0, max_tokens=24, ignore_eos=True)
    finally:
        single.shutdown()
    got = await collect(engine, "w2", prompt, temperature=0, max_tokens=24, ignore_eos=True)
    assert token_ids(got) == token_ids(want) and len(token_ids(got)) == 24
    last = got[-1]
    assert (last.finished, last.finish_reason, last.completion_tokens) == (True, "length", 24)
    assert last.prompt_tokens == len(prompt)


async def test_two_nodes_a_stream_decodes_between_a_long_prompts_chunks(
    unit: tuple[LeaderEngine, Node],
) -> None:
    """Mixed steps (a decode beside a prompt chunk, 11 of them) at TP=2 give each request
    what it gets alone, unchunked: the stream runs from before the long prompt arrives until
    long after its last chunk."""
    engine, _ = unit
    greedy: dict[str, Any] = {"temperature": 0, "ignore_eos": True}
    single = unchunked().start()
    try:
        short_want = await collect(single, "s1", PROMPT, max_tokens=200, **greedy)
        long_want = await collect(single, "l1", LONG_PROMPT, max_tokens=8, **greedy)
    finally:
        single.shutdown()
    seen: list[TokenEvent] = []

    async def stream() -> None:
        request = GenerationRequest("s2", PROMPT, SamplingParams(max_tokens=200, **greedy))
        async for event in engine.generate(request):
            seen.append(event)

    running = asyncio.create_task(stream())
    await wait_until(lambda: len(seen) >= 2, 30)
    long_got = await collect(engine, "l2", LONG_PROMPT, max_tokens=8, **greedy)
    await asyncio.wait_for(running, 60)
    assert token_ids(long_got) == token_ids(long_want)
    assert token_ids(seen) == token_ids(short_want) and len(seen) == 200


async def test_concurrent_requests_all_complete(unit: tuple[LeaderEngine, Node]) -> None:
    engine, _ = unit
    runs = [collect(engine, f"c{i}", temperature=0.8, seed=i, max_tokens=16) for i in range(4)]
    results = await asyncio.wait_for(asyncio.gather(*runs), 30)
    for events in results:
        assert events[-1].finished and events[-1].error is None
        assert events[-1].completion_tokens == len(token_ids(events))


async def test_n_choices_share_one_prefill_and_each_decodes(
    unit: tuple[LeaderEngine, Node],
) -> None:
    """Greedy choices copy the prompt's KV on every node (on a pipeline, each stage after
    its own layers) and then decode as one request alone does."""
    engine, _ = unit
    alone = token_ids(await collect(engine, "n0", temperature=0, max_tokens=12, ignore_eos=True))
    request = GenerationRequest(
        "n3", PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), n=3
    )
    events = [event async for event in engine.generate(request)]
    for index in range(3):
        got = [e.token_id for e in events if e.index == index and e.token_id is not None]
        assert got == alone, index


async def test_abort_frees_the_slot(unit: tuple[LeaderEngine, Node]) -> None:
    engine, _ = unit
    request = GenerationRequest("a1", PROMPT, SamplingParams(max_tokens=400, ignore_eos=True))
    events = []
    async for event in engine.generate(request):
        events.append(event)
        if len(events) == 3:
            engine.abort("a1")
    assert events[-1].finish_reason == "abort" and len(events) < 50
    await wait_until(lambda: engine.scheduler.free_slots == 4, 5)
    assert engine.health()["kv_slots_used"] == 0


async def test_follower_health_reports_steps(
    unit: tuple[LeaderEngine, Node],
) -> None:
    engine, follower = unit
    port = follower.health_port()
    status, before = get_health(port)
    assert status == 200
    assert (before["status"], before["role"], before["rank"], before["unit"]) == (
        "ok",
        "follower",
        1,
        "u1",
    )
    await collect(engine, "h1", temperature=0, max_tokens=5, ignore_eos=True)
    # Followers run every leader step; the follower counts its step after its own forward,
    # which may end a moment after the leader has already handed out the last token.
    await wait_until(lambda: get_health(port)[1]["step"] == engine.health()["step"], 10)
    _, after = get_health(port)
    assert after["step"] >= before["step"] + 5
    assert after["kv_slots_total"] == 4


async def wait_until(check: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
