"""The limits on a real redis-server (tests/redis_support.py): the Lua scripts against the
in-memory store's arithmetic, three Limiters ("replicas") sharing one Redis over a simulated
minute, and Redis killed and brought back mid-minute."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.limits.decisions import Grant, KeyLimits
from gateway.limits.memory import Counts, MemoryStore
from gateway.limits.redis_store import RedisStore
from gateway.limits.store import Ask, Changes, Dim
from tests.gateway.limits.limits_support import T0, Fleet
from tests.redis_support import RedisServer, redis_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path / "redis") as running:
        yield running


@pytest.fixture
async def stores(server: RedisServer) -> AsyncIterator[list[RedisStore]]:
    made = [store_of(server, f"r{i}") for i in range(3)]
    yield made
    for store in made:
        await store.close()


def degraded(fleet: Fleet) -> bool:
    return any(limiter.degraded for limiter in fleet.limiters)


def store_of(server: RedisServer, replica: str) -> RedisStore:
    client = aioredis.Redis(
        unix_socket_path=str(server.socket), socket_timeout=1.0, socket_connect_timeout=1.0
    )
    return RedisStore(client, "test", replica, ttl=3.0, timeout=1.0)


async def test_the_lua_scripts_answer_as_the_memory_store_does(stores: list[RedisStore]) -> None:
    counts = Counts()
    memory = [MemoryStore(f"r{i}", ttl=3.0, counts=counts) for i in range(2)]
    rng = random.Random(27)
    now = T0 + 0.5
    dims: list[tuple[Dim, int]] = [("requests", 30), ("tokens", 3000), ("inflight", 6)]
    for step in range(400):
        now += rng.choice([0.0, 0.1, 0.7, 3.0, 20.0])
        who = rng.randrange(2)
        if rng.random() < 0.7:
            chosen = rng.sample(dims, rng.randint(1, 3))
            asks = [
                Ask(dim, limit, rng.randint(1, 400 if dim == "tokens" else 3), 50, rng.random())
                for dim, limit in chosen
            ]
            expected = memory[who].take_now("k", asks, now)
            got = await stores[who].take("k", asks, now)
            assert got == expected, (step, asks)
        else:
            changes = Changes()
            for _ in range(rng.randint(0, 4)):
                bucket = int(now) - rng.randint(0, 70)
                changes.add("k", rng.choice(["requests", "tokens"]), bucket, rng.randint(-60, 30))
            if rng.random() < 0.5:
                changes.held["k"] = rng.randint(0, 4)
            memory[who].push_now(changes, now)
            await stores[who].push(changes, now)


async def test_three_replicas_at_120_rpm_admit_120_of_300_over_a_minute(
    stores: list[RedisStore],
) -> None:
    fleet = Fleet.of(stores)
    limits = KeyLimits(rpm=120, max_inflight=50)
    for i in range(300):
        await fleet.advance(T0 + i * 0.2)
        grant = await fleet.admit(i % 3, "k", limits, 0)
        if grant is not None:
            fleet.settle(i % 3, grant, 0)
    assert 119 <= len(fleet.grants) <= 120
    ops = sum(store.ops for store in stores)
    print(f"\n120 rpm over 3 replicas: {ops} store calls for 300 requests ({ops / 300:.2f} each)")


async def test_tokens_per_minute_land_within_5_percent(stores: list[RedisStore]) -> None:
    fleet = Fleet.of(stores)
    limits = KeyLimits(tpm=10_000)
    rng = random.Random(5)
    charged = 0
    for i in range(300):
        await fleet.advance(T0 + i * 0.2)
        replica = rng.randrange(3)
        grant = await fleet.admit(replica, "k", limits, 200)
        if grant is not None:
            used = rng.randint(120, 300)  # the estimate is off both ways
            fleet.settle(replica, grant, used)
            charged += used
    assert abs(charged - 10_000) <= 500, charged


async def test_redis_killed_mid_minute_the_shares_hold_and_the_fleet_recovers(
    server: RedisServer, stores: list[RedisStore]
) -> None:
    fleet = Fleet.of(stores)
    limits = KeyLimits(rpm=120, tpm=100_000, max_inflight=50)
    degraded_seen = False
    for i in range(300):
        await fleet.advance(T0 + i * 0.2)
        if i == 40:
            server.kill()
        if i == 200:
            server.start()
        grant = await fleet.admit(i % 3, "k", limits, 100)  # never raises
        degraded_seen |= any(limiter.degraded for limiter in fleet.limiters)
        if grant is not None:
            fleet.settle(i % 3, grant, 100)
    assert degraded_seen
    assert not any(limiter.degraded for limiter in fleet.limiters)
    # each replica admitted up to its share (40) counting its own from before the outage
    assert 115 <= len(fleet.grants) <= 120
    # what was admitted during the outage was replayed: the shared window knows all of it
    client = server.client()
    window = client.hgetall("test:limits:k:requests")
    client.close()
    assert sum(int(v) for v in window.values()) == len(fleet.grants)
    assert await fleet.admit(0, "k", limits, 100) is None
    await fleet.advance(T0 + 130)
    assert await fleet.admit(0, "k", limits, 100) is not None


async def test_a_dead_replicas_slots_are_let_go_after_their_expiry(
    stores: list[RedisStore],
) -> None:
    fleet = Fleet.of(stores[:2])
    limits = KeyLimits(max_inflight=3)
    for _ in range(3):
        assert await fleet.admit(0, "k", limits, 0) is not None
    assert await fleet.admit(1, "k", limits, 0) is None
    fleet.limiters.pop(0)  # replica 0 dies holding 3
    await fleet.advance(T0 + 2.0)
    assert await fleet.admit(0, "k", limits, 0) is None
    await fleet.advance(T0 + 3.5)
    assert await fleet.admit(0, "k", limits, 0) is not None


async def test_a_hung_redis_costs_one_timeout_then_the_shares_apply(server: RedisServer) -> None:
    client = aioredis.Redis(
        unix_socket_path=str(server.socket), socket_timeout=0.3, socket_connect_timeout=0.3
    )
    store = RedisStore(client, "test", "r0", ttl=3.0, timeout=0.3)
    fleet = Fleet.of([store])
    limits = KeyLimits(rpm=2)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert await fleet.admit(0, "k", limits, 0) is not None  # the share: 2 // 1
        assert time.monotonic() - started < 1.0
        assert degraded(fleet)
        started = time.monotonic()
        assert await fleet.admit(0, "k", limits, 0) is not None
        assert await fleet.admit(0, "k", limits, 0) is None  # never unlimited
        assert time.monotonic() - started < 0.25  # no store call (a 0.3 s timeout) meanwhile
    finally:
        server.proc.send_signal(signal.SIGCONT)
    await fleet.advance(T0 + 0.5)
    assert not degraded(fleet)
    await store.close()


async def test_a_busy_key_costs_a_few_store_calls_per_second(stores: list[RedisStore]) -> None:
    fleet = Fleet.of(stores)
    limits = KeyLimits(rpm=100_000, tpm=10_000_000, max_inflight=1000)
    rng = random.Random(3)
    live: list[tuple[int, Grant]] = []
    requests = 6000
    for i in range(requests):  # 100 requests/s for a minute, 20 in flight
        await fleet.advance(T0 + i * 0.01)
        replica = rng.randrange(3)
        grant = await fleet.admit(replica, "k", limits, 300)
        assert grant is not None
        live.append((replica, grant))
        if len(live) > 20:
            done_replica, done = live.pop(0)
            fleet.settle(done_replica, done, rng.randint(100, 500))
    ops = sum(store.ops for store in stores)
    takes = sum(limiter.takes for limiter in fleet.limiters)
    print(f"\n100 requests/s over 3 replicas: {ops} store calls ({takes} takes) for {requests}")
    assert ops / requests < 0.2


async def test_the_census_counts_the_processes_sharing_the_store(server: RedisServer) -> None:
    """Each limiter reports itself; one silent for CENSUS_KEPT no longer counts, so the
    share a replica enforces while the store is away follows the live fleet."""
    from gateway.limits.redis_store import CENSUS_KEPT

    stores = [store_of(server, f"r{i}") for i in range(3)]
    try:
        counts = [await s.census(T0) for s in stores]
        assert counts == [1, 2, 3]
        assert await stores[0].census(T0 + CENSUS_KEPT - 1) == 3
        assert await stores[0].census(T0 + CENSUS_KEPT + 1) == 1  # r1 and r2 went silent
    finally:
        for s in stores:
            await s.close()
