"""A key's limits hold across three gateway replicas sharing one real redis-server.

Three gateway processes (tests/chaos/clusters.py) in front of the simulator, `[auth]
required`, one key: 300 requests spread round-robin over the replicas within a minute, at a
key of 120 rpm, are answered 120 times (plus or minus 1) and refused with 429 otherwise; and a
key of N tokens per minute is served within 5% of N tokens, counted from the answers' own
usage. Then Redis is killed under load: the replicas keep answering (200 or 429, never an
error), each within its share, and the shared limits apply again once it is back.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.chaos.clusters import GatewayProcess, start_replicas
from tests.redis_support import RedisServer
from tests.support import MODEL, SimProcess, chat_body

# Counts admissions over real minutes' windows across replicas: it runs alone in `make test`.
pytestmark = [pytest.mark.serial, pytest.mark.slow, pytest.mark.timeout(180)]

NAMES = ["r0", "r1", "r2"]
CHAT = "/v1/chat/completions"


@pytest.fixture
def fleet(sim: SimProcess, store: RedisServer, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    sim.post("/reset")
    state = {"backend": "redis", "url": store.url, "key_prefix": "limits"}
    replicas = start_replicas(tmp_path, sim, MODEL, NAMES, state, auth={"required": True})
    try:
        yield replicas
    finally:
        for gw in replicas:
            gw.close()


def make_key(gw: GatewayProcess, **body: Any) -> str:
    return str(gw.ops.admin("/admin/keys", {"tenant": "acme", **body})["key"])


async def accepted_everywhere(
    http: aiohttp.ClientSession, fleet: list[GatewayProcess], key: str
) -> None:
    """A new key reaches the other replicas through the shared state (within a second)."""
    headers = {"Authorization": f"Bearer {key}"}
    for gw in fleet:
        for _ in range(100):
            async with http.get(gw.public + "/v1/models", headers=headers) as resp:
                if resp.status == 200:
                    break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"{gw.public} never accepted the key")


async def send(
    http: aiohttp.ClientSession,
    fleet: list[GatewayProcess],
    key: str,
    count: int,
    concurrency: int,
    max_tokens: int = 4,
    rate: float | None = None,
) -> list[tuple[int, dict[str, Any], dict[str, str]]]:
    """`count` requests, request i through replica i % 3, `concurrency` at a time, and with
    `rate`, request i not before i / rate seconds."""
    headers = {"Authorization": f"Bearer {key}"}
    results: list[tuple[int, dict[str, Any], dict[str, str]]] = []
    gate = asyncio.Semaphore(concurrency)
    start = asyncio.get_running_loop().time()

    async def one(i: int) -> None:
        if rate is not None:
            await asyncio.sleep(max(0.0, start + i / rate - asyncio.get_running_loop().time()))
        async with gate:
            url = fleet[i % len(fleet)].public + CHAT
            body = chat_body(stream=False, max_tokens=max_tokens)
            async with http.post(url, json=body, headers=headers) as resp:
                head = dict(resp.headers)
                head["replica"] = str(i % len(fleet))
                results.append((resp.status, await resp.json(), head))

    await asyncio.gather(*(one(i) for i in range(count)))
    return results


async def test_a_key_at_120_rpm_is_served_120_times_across_three_replicas(
    fleet: list[GatewayProcess],
) -> None:
    key = make_key(fleet[0], rpm=120)
    async with aiohttp.ClientSession() as http:
        await accepted_everywhere(http, fleet, key)
        # Spread over 15 s of the minute (as clients do), so the requests refused at the
        # limit keep coming while leases taken by one replica go back to the others.
        results = await send(http, fleet, key, 300, concurrency=12, rate=20.0)
    statuses = Counter(status for status, _, _ in results)
    assert set(statuses) <= {200, 429}, statuses
    assert abs(statuses[200] - 120) <= 1, statuses
    refused = [(body, head) for status, body, head in results if status == 429]
    assert all(b["error"]["code"] == "rate_limit_exceeded" for b, _ in refused)
    assert all(int(h["Retry-After"]) >= 1 for _, h in refused)


async def test_a_key_at_n_tokens_per_minute_is_served_within_5_percent_of_n(
    fleet: list[GatewayProcess],
) -> None:
    tpm = 3000
    key = make_key(fleet[0], tpm=tpm)
    async with aiohttp.ClientSession() as http:
        await accepted_everywhere(http, fleet, key)
        served = 0
        for _ in range(12):  # rounds, each after the last one's settles reached the store
            results = await send(http, fleet, key, 30, concurrency=6, max_tokens=16)
            for status, body, _ in results:
                assert status in (200, 429), (status, body)
                if status == 200:
                    served += int(body["usage"]["total_tokens"])
            await asyncio.sleep(0.6)
    assert abs(served - tpm) <= 0.05 * tpm, served


async def test_with_redis_killed_under_load_each_replica_holds_its_share_and_recovers(
    fleet: list[GatewayProcess], store: RedisServer
) -> None:
    rpm = 90
    key = make_key(fleet[0], rpm=rpm)
    async with aiohttp.ClientSession() as http:
        await accepted_everywhere(http, fleet, key)
        before = await send(http, fleet, key, 30, concurrency=6)  # 10 through each replica
        assert [s for s, _, _ in before].count(200) == 30
        # Each replica counts the others (the store's census) within 0.5 s of their start;
        # the last one started a moment ago.
        await asyncio.sleep(1.0)
        store.kill()
        during = await send(http, fleet, key, 150, concurrency=6)
        statuses = Counter(s for s, _, _ in during)
        per = Counter(h["replica"] for s, _, h in during if s == 200)
        assert set(statuses) <= {200, 429}, statuses  # answered all the same, never a 5xx
        # Each replica admits its share, 90 // 3, counting its own 10 from before.
        assert per == {"0": 20, "1": 20, "2": 20}, per
        store.start()
        # Back on the store: what was admitted meanwhile is in the shared minute, so the
        # key's minute is spent whichever replica is asked.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while True:
            after = await send(http, fleet, key, 6, concurrency=3)
            assert all(s == 429 for s, _, _ in after), [s for s, _, _ in after]
            views = [gw.ops.unit("u0") for gw in fleet]  # the replicas answer their admin API
            assert all(v["id"] == "u0" for v in views)
            if loop.time() > deadline:
                break
            await asyncio.sleep(1.0)
