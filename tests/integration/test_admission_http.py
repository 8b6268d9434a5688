"""429 when saturated, 503 when nothing is routable, both with Retry-After and a JSON body."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp

from gateway.server import running
from tests.support import SimProcess, chat_body, gateway_config

CHAT = "/v1/chat/completions"


async def test_saturated_gives_429(clean_sim: SimProcess, http: aiohttp.ClientSession) -> None:
    clean_sim.post("/units/u0/settings", {"ttft_ms": 0, "itl_ms": 100, "tokens": 20})
    config = gateway_config(
        clean_sim.units[:1],
        admission={"unit_max_inflight": 1, "queue_size": 1, "queue_timeout": 0.3, "retry_after": 7},
    )
    async with running(config) as gw:
        holder = await http.post(gw.public_url + CHAT, json=chat_body())
        assert holder.status == 200
        waiting = asyncio.create_task(http.post(gw.public_url + CHAT, json=chat_body()))
        while gw.admission.queued < 1:
            await asyncio.sleep(0.005)
        async with http.post(gw.public_url + CHAT, json=chat_body()) as resp:  # queue full: at once
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "7"
            assert (await resp.json())["error"]["code"] == "saturated"
        async with await waiting as resp:  # waited 0.3 s, unit still busy
            assert resp.status == 429
            assert "stayed at capacity" in (await resp.json())["error"]["message"]
        holder.close()


async def test_waiting_request_gets_the_freed_slot(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    config = gateway_config(
        clean_sim.units[:1], admission={"unit_max_inflight": 1, "queue_timeout": 5.0}
    )
    async with running(config) as gw:
        results = await asyncio.gather(*(_status(http, gw.public_url) for _ in range(5)))
        assert results == [200] * 5


async def _status(http: aiohttp.ClientSession, url: str) -> int:
    async with http.post(url + CHAT, json=chat_body()) as resp:
        await resp.read()
        return resp.status


async def test_no_routable_unit_gives_503(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    config = gateway_config(clean_sim.units)
    config = replace(config, units=tuple(replace(u, enabled=False) for u in config.units))
    async with running(config) as gw:
        async with http.post(gw.public_url + CHAT, json=chat_body()) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "1"
            assert (await resp.json())["error"]["code"] == "no_routable_unit"
        async with http.get(gw.public_url + "/readyz") as resp:
            assert resp.status == 503
        async with http.get(gw.public_url + "/healthz") as resp:
            assert resp.status == 200
