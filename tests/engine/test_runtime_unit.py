"""A real unit: the leader in this process, followers as
`python -m engine.backends.builtin.bare` subprocesses, one Gloo group over 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace

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


@pytest.fixture(scope="module")
def unit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LeaderEngine, Node]]:
    engine, follower = start_unit(tmp_path_factory.mktemp("unit"), timeout=10.0)
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


@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "overflows-frame"])
async def test_tp2_greedy_matches_world_size_1(
    unit: tuple[LeaderEngine, Node], prompt: tuple[int, ...]
) -> None:
    engine, _ = unit
    config = replace(ModelConfig.tiny(), max_seq_len=MAX_SEQ_LEN)
    single = LeaderEngine(
        init_from_seed(config, seed=0, num_slots=4), ByteTokenizer(), model_name="t"
    ).start()
    try:
        want = await collect(single, "w1", prompt, temperature=0, max_tokens=24, ignore_eos=True)
    finally:
        single.shutdown()
    got = await collect(engine, "w2", prompt, temperature=0, max_tokens=24, ignore_eos=True)
    assert token_ids(got) == token_ids(want) and len(token_ids(got)) == 24
    last = got[-1]
    assert (last.finished, last.finish_reason, last.completion_tokens) == (True, "length", 24)
    assert last.prompt_tokens == len(prompt)


async def test_concurrent_requests_all_complete(unit: tuple[LeaderEngine, Node]) -> None:
    engine, _ = unit
    runs = [collect(engine, f"c{i}", temperature=0.8, seed=i, max_tokens=16) for i in range(4)]
    results = await asyncio.wait_for(asyncio.gather(*runs), 30)
    for events in results:
        assert events[-1].finished and events[-1].error is None
        assert events[-1].completion_tokens == len(token_ids(events))


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
