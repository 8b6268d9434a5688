"""The prefix cache in a running engine: a cached prefix is not computed again, greedy output
is the same with and without reuse (forks and a conversation's next turn included), the
answer and the node's reports count it, and the leader publishes its KV events on a real ZMQ
socket that the gateway's own subscriber indexes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest
import zmq.asyncio

from engine.api import GenerationRequest, TokenEvent
from engine.backends.builtin.node import start_leader
from engine.flags import parse
from engine.model import ByteTokenizer, ModelConfig, init_from_seed
from engine.prefixcache import BlockStored, CacheEvent
from engine.runtime import LeaderEngine
from engine.runtime.node_metrics import render
from engine.scheduler import SamplingParams
from gateway.base.ports import free_port
from gateway.kvevents.index import KvIndex
from gateway.kvevents.keys import block_keys
from gateway.kvevents.subscriber import Source, Subscriber

SYSTEM = tuple(range(1, 200))  # a long shared system prompt: 12 full blocks and 7 tokens


def engine(
    caching: bool,
    on_events: Callable[[Sequence[CacheEvent]], object] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> LeaderEngine:
    config = replace(ModelConfig.tiny(), max_seq_len=512)
    model = init_from_seed(config, seed=0, num_slots=4)
    return LeaderEngine(
        model,
        ByteTokenizer(),
        model_name="t",
        prefill_chunk=64,
        prefix_caching=caching,
        publish_events=on_events,
        on_step=on_step,
    ).start()


async def ask(e: LeaderEngine, rid: str, prompt: Sequence[int], n: int = 1) -> list[TokenEvent]:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    request = GenerationRequest(rid, tuple(prompt), params, n=n)
    return [event async for event in e.generate(request)]


def ids(events: list[TokenEvent], index: int = 0) -> list[int]:
    return [e.token_id for e in events if e.token_id is not None and e.index == index]


async def conversation(e: LeaderEngine) -> tuple[list[list[int]], list[int]]:
    """Four requests sharing the system prompt: each one's greedy tokens (both choices of the
    last), and the cached tokens each answer reported."""
    first = await ask(e, "a", [*SYSTEM, 7, 8, 9])
    second = await ask(e, "b", [*SYSTEM, 40, 41])
    turn = [*SYSTEM, 7, 8, 9, *ids(first), 50, 51, 52]  # the first one's next turn
    third = await ask(e, "c", turn)
    forked = await ask(e, "d", [*SYSTEM, 60], n=2)
    answers = [ids(first), ids(second), ids(third), ids(forked, 0), ids(forked, 1)]
    return answers, [events[-1].cached_tokens for events in (first, second, third, forked)]


async def test_reuse_changes_no_greedy_token_and_skips_the_cached_prefix() -> None:
    events: list[CacheEvent] = []
    cold, warm = engine(False), engine(True, events.extend)
    try:
        want, none = await conversation(cold)
        got, cached = await conversation(warm)
        report = warm.health()
    finally:
        cold.shutdown()
        warm.shutdown()
    assert got == want and all(len(a) == 12 for a in got)
    assert none == [0, 0, 0, 0]
    # 12 blocks of the system prompt; the next turn also had the first answer's blocks
    assert cached == [0, 192, 208, 192]
    assert report["prefix_cache_hits"] == sum(cached)
    assert report["prefix_cache_queries"] == 202 + 201 + 217 + 200  # whole prompts
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert stored[0].token_ids == SYSTEM[: len(stored[0].token_ids)] and stored[0].block_size == 16
    text = render(report)
    assert f'vllm:prefix_cache_hits_total{{unit="",rank="0"}} {sum(cached)}' in text


async def test_a_request_with_a_cached_prefix_starts_sooner() -> None:
    """The cached request's prefill is its last few tokens: fewer steps before its first
    token than the same request cold (the benchmark measures the time)."""
    steps: list[int] = []
    e = engine(True, on_step=lambda start, end: steps.append(end))
    try:
        await ask(e, "cold", [*SYSTEM, 1])
        cold = len(steps)
        await ask(e, "warm", [*SYSTEM, 2])
        warm = len(steps) - cold
    finally:
        e.shutdown()
    # cold: 200 prompt tokens in chunks of 64 (4 steps) then 11 decodes; warm: one step
    assert (cold, warm) == (4 + 11, 1 + 11)


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.02)


async def test_the_leader_publishes_kv_events_the_gateway_indexes() -> None:
    """`--kv-events` on a real node: the gateway's subscriber (real ZMQ, replay included)
    learns that this unit holds the system prompt's blocks once a request has run."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    flags = ["--role", "leader", "--num-slots", "4", "--max-seq-len", "512"]
    leader = start_leader(parse([*flags, "--kv-events", endpoint, "--kv-events-replay", replay]))
    index = KvIndex(10_000)
    context = zmq.asyncio.Context()
    sub = Subscriber(Source("u1", endpoint, replay), index, context, lambda *_: None)
    task = asyncio.create_task(sub.run())
    try:
        await ask(leader, "x", [*SYSTEM, 3])  # published before the gateway looks: replayed
        await until(lambda: index.match(block_keys(list(SYSTEM), 16)).get("u1", 0) == 12)
        assert sub.garbage == 0 and sub.dropped == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        leader.shutdown()
        context.term()


def test_kv_events_need_the_builtin_leader_with_prefix_caching() -> None:
    base = ["--role", "leader", "--kv-events", "tcp://127.0.0.1:5557"]
    with pytest.raises(ValueError, match="--kv-events: with --no-prefix-caching"):
        parse([*base, "--no-prefix-caching"])
    with pytest.raises(ValueError, match="--kv-events: expected tcp"):
        parse(["--role", "leader", "--kv-events", "localhost:5557"])
    with pytest.raises(ValueError, match="--kv-events-replay: needs --kv-events"):
        parse(["--role", "leader", "--kv-events-replay", "tcp://127.0.0.1:5558"])
    follower = ["--role", "follower", "--rank", "1", "--world-size", "2"]
    with pytest.raises(ValueError, match="only the leader publishes"):
        parse([*follower, "--kv-events", "tcp://127.0.0.1:5557"])
