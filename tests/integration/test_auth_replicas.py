"""A key revoked through one replica is refused by every replica within 100 ms (p99).

Three gateway processes (replicas r0, r1, r2: tests/chaos/clusters.py) share their admin
state through one real redis-server, with `[auth] required = true`. Each of 50 trials makes
a key through one replica, waits until the other two accept it, then revokes it through the
first while polling the other two with it (GET /v1/models, which needs the key) until both
answer 401. A trial's time runs from just before the DELETE is sent to the later of the two
401s, so it includes the revoking replica's own write; the polling adds at most one request's
round trip. A second test does the same through a gateway of two worker processes, which
learn of a revocation from their control plane's state broadcast.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.chaos.clusters import GatewayProcess, start_gateway, start_replicas
from tests.redis_support import RedisServer
from tests.support import MODEL, SimProcess

# Times a revocation's reach (p99 under 100 ms): it runs alone in `make test`.
pytestmark = [pytest.mark.serial, pytest.mark.slow, pytest.mark.timeout(120)]

NAMES = ["r0", "r1", "r2"]
TRIALS = 50
WITHIN_S = 0.100  # p99, issue 27
ACCEPTED_WITHIN_S = 2.0  # a new key reaching the other replicas (not what is measured)
AUTH = {"required": True}


@pytest.fixture
def fleet(sim: SimProcess, store: RedisServer, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    state = {"backend": "redis", "url": store.url, "key_prefix": "keys"}
    replicas = start_replicas(tmp_path, sim, MODEL, NAMES, state, auth=AUTH)
    try:
        yield replicas
    finally:
        for gw in replicas:
            gw.close()


async def admin(
    http: aiohttp.ClientSession, gw: GatewayProcess, method: str, path: str, body: Any = None
) -> Any:
    headers = {"Authorization": f"Bearer {gw.ops.token}"}
    async with http.request(method, gw.ops.url + path, json=body, headers=headers) as resp:
        assert resp.status in (200, 201), await resp.text()
        return await resp.json()


async def status_with(http: aiohttp.ClientSession, public: str, secret: str) -> int:
    headers = {"Authorization": f"Bearer {secret}"}
    async with http.get(public + "/v1/models", headers=headers) as resp:
        await resp.read()
        return resp.status


async def until_status(
    http: aiohttp.ClientSession, public: str, secret: str, wanted: int, within: float
) -> float:
    """Poll until `wanted`; the monotonic time it was first seen."""
    deadline = time.monotonic() + within
    while (status := await status_with(http, public, secret)) != wanted:
        assert status in (200, 401), status
        assert time.monotonic() < deadline, f"{public} never answered {wanted}"
    return time.monotonic()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def trial(http: aiohttp.ClientSession, writer: GatewayProcess, readers: list[str]) -> float:
    made = await admin(http, writer, "POST", "/admin/keys", {"tenant": "acme"})
    secret = made["key"]
    for public in readers:
        await until_status(http, public, secret, 200, ACCEPTED_WITHIN_S)
    start = time.monotonic()
    revoking = asyncio.create_task(admin(http, writer, "DELETE", f"/admin/keys/{made['id']}"))
    refused = [until_status(http, public, secret, 401, 5.0) for public in readers]
    seen = await asyncio.gather(*refused)
    assert (await revoking)["state"] == "revoked"
    return max(seen) - start


def report(what: str, times: list[float]) -> None:
    ms = [t * 1e3 for t in times]
    print(
        f"\n{what}: {len(ms)} trials, p50 {percentile(ms, 0.5):.1f} ms, "
        f"p99 {percentile(ms, 0.99):.1f} ms, max {max(ms):.1f} ms"
    )


async def test_a_revocation_reaches_every_replica_within_100_ms(
    fleet: list[GatewayProcess],
) -> None:
    times = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        for i in range(TRIALS):
            writer = fleet[i % len(fleet)]
            readers = [gw.public for gw in fleet if gw is not writer]
            times.append(await trial(http, writer, readers))
    report("revocation across 3 replicas", times)
    assert percentile(times, 0.99) < WITHIN_S, sorted(times)[-5:]


@pytest.fixture
def workers(sim: SimProcess, tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = start_gateway(tmp_path, sim, MODEL, gateway={"workers": 2}, auth=AUTH)
    try:
        yield gw
    finally:
        gw.close()


async def test_a_revocation_reaches_every_worker(workers: GatewayProcess) -> None:
    """Each poll is a new connection, which SO_REUSEPORT hands to either worker: a trial ends
    at the first 401 after which 20 polls in a row are refused too."""
    times = []
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(10):
            made = await admin(http, workers, "POST", "/admin/keys", {"tenant": "acme"})
            secret = made["key"]
            for _ in range(20):  # both workers have it
                await until_status(http, workers.public, secret, 200, ACCEPTED_WITHIN_S)
            start = time.monotonic()
            await admin(http, workers, "DELETE", f"/admin/keys/{made['id']}")
            first = await until_status(http, workers.public, secret, 401, 5.0)
            for _ in range(20):
                assert await status_with(http, workers.public, secret) == 401
            times.append(first - start)
    report("revocation to 2 workers", times)
