"""The shared rollout's store on a real redis-server: one lease holder writes, a process that
lost the lease cannot, operators' asks reach the driver once, and every process's samples add
up until the rollout ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.admin.shared import SharedStore, StoreUnavailable
from gateway.admin.shared_rollouts import SharedRollouts
from gateway.config.state import StateConfig
from gateway.rollout.ports import LostLease
from tests.redis_support import RedisServer, redis_server

TTL = 0.4


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path / "redis") as found:
        yield found


@pytest.fixture
async def pair(server: RedisServer) -> AsyncIterator[tuple[SharedRollouts, SharedRollouts]]:
    stores = []
    for name in ("r0", "r1"):
        config = StateConfig(
            backend="redis", url=server.url, replica=name, heartbeat=0.1, replica_ttl=TTL
        )
        stores.append((SharedStore(config), config))
    yield SharedRollouts(*stores[0]), SharedRollouts(*stores[1])
    for store, _ in stores:
        await store.close()


def record(rollout: str, step: int, started: float = 1.0) -> dict[str, object]:
    return {"id": rollout, "step": step, "started": started}


async def test_only_the_lease_holder_writes_until_its_lease_expires(
    pair: tuple[SharedRollouts, SharedRollouts],
) -> None:
    a, b = pair
    assert await a.acquire() and not await b.acquire()
    await a.put_rollout("r-1", 1.0, record("r-1", 0))
    with pytest.raises(LostLease):
        await b.put_rollout("r-1", 1.0, record("r-1", 5))
    found = await b.load()
    assert found.current == record("r-1", 0) and found.driver == a.instance

    await a.tick(None)  # renewed: still a's after more than a TTL of renewals
    for _ in range(3):
        await asyncio.sleep(TTL / 2)
        await a.tick(None)
    assert not await b.acquire()

    await asyncio.sleep(TTL * 1.5)  # a stalls past its lease: b takes it over
    assert await b.acquire()
    await b.put_rollout("r-1", 1.0, record("r-1", 1))
    with pytest.raises(LostLease):
        await a.put_rollout("r-1", 1.0, record("r-1", 0))  # cannot undo b's step
    with pytest.raises(LostLease):
        await a.tick(None)
    with pytest.raises(LostLease):
        await a.set_serving({"a": "v2"})
    await a.release()  # not a's: nothing happens
    assert (await a.load()).driver == b.instance
    await b.set_serving({"a": "v2"})
    await b.release()
    found = await a.load()
    assert (found.current, found.serving, found.driver) == (record("r-1", 1), {"a": "v2"}, None)


async def test_asks_reach_the_driver_once_and_samples_add_up_until_cleared(
    pair: tuple[SharedRollouts, SharedRollouts],
) -> None:
    a, b = pair
    assert await a.acquire()
    await b.command("pause", "r-1", "bob")
    await b.publish({"key": ["r-1", 1, 0], "from": "b"})
    asks, samples = await a.tick({"key": ["r-1", 1, 0], "from": "a"})
    assert asks == [{"verb": "pause", "id": "r-1", "who": "bob"}]
    assert samples == {
        a.instance: {"key": ["r-1", 1, 0], "from": "a"},
        b.instance: {"key": ["r-1", 1, 0], "from": "b"},
    }
    asks, _ = await a.tick(None)
    assert asks == []  # taken once
    await a.clear_samples()
    assert (await a.tick(None))[1] == {}


async def test_history_is_oldest_first_and_an_unreachable_store_is_named(
    pair: tuple[SharedRollouts, SharedRollouts], server: RedisServer
) -> None:
    a, _ = pair
    assert await a.acquire()
    await a.put_rollout("r-2", 2.0, record("r-2", 0, started=2.0))
    await a.put_rollout("r-1", 1.0, record("r-1", 0, started=1.0))
    assert [r["id"] for r in await a.history()] == ["r-1", "r-2"]
    assert (await a.load()).current == record("r-1", 0, started=1.0)  # the last written
    server.kill()
    for call in (a.load(), a.acquire(), a.tick(None), a.command("abort", "r-1", "x")):
        with pytest.raises(StoreUnavailable, match="unreachable"):
            await call
