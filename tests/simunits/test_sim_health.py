"""Node /health, health fault modes, client disconnects and reset."""

from __future__ import annotations

import asyncio
import os
import time

import aiohttp
import pytest

from loadtest.simunits import SimCluster
from loadtest.simunits.client import ControlClient

STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def _health(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, object]]:
    async with session.get(url + "/health") as resp:
        return resp.status, await resp.json()


async def test_health_fields_and_shared_step(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    unit = cluster.units[1]
    assert unit.node_urls[0] == unit.leader_url  # rank 0 serves the API and /health together
    async with session.post(unit.leader_url + "/v1/completions", json={"prompt": "x"}) as resp:
        assert resp.status == 200
    _, leader = await _health(session, unit.node_urls[0])
    _, follower = await _health(session, unit.node_urls[1])
    assert leader == {
        "status": "ok",
        "role": "leader",
        "unit": "u1",
        "rank": 0,
        "pid": os.getpid(),
        "step": 8,
        "pending": 0,
    }
    assert follower == {**leader, "role": "follower", "rank": 1}
    await control.fault("u1", "hang")
    hung = asyncio.create_task(session.post(unit.leader_url + "/v1/chat/completions", json=STREAM))
    try:
        await control.wait_stats("u1", lambda s: s["in_flight"] == 1)
        assert (await _health(session, unit.node_urls[0]))[1]["pending"] == 1
        assert (await _health(session, unit.node_urls[1]))[1]["pending"] == 0
    finally:
        hung.cancel()


async def test_health_modes(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    follower = cluster.units[0].node_urls[1]
    await control.node_health("u0", 1, "unhealthy")
    status, body = await _health(session, follower)
    assert (status, body["status"]) == (503, "unhealthy")
    assert (await _health(session, cluster.units[0].node_urls[0]))[0] == 200

    await control.node_health("u0", 1, "slow", delay_ms=150)
    start = time.monotonic()
    assert (await _health(session, follower))[0] == 200
    # The simulator sleeps 150 ms on uvloop, whose timers count from the loop's cached time
    # (taken when its iteration began, in milliseconds): the sleep may end up to a
    # millisecond or two before 150 ms of the wall clock have passed.
    assert time.monotonic() - start >= 0.15 - 0.002

    await control.node_health("u0", 1, "unresponsive")
    with pytest.raises(asyncio.TimeoutError):
        await session.get(follower + "/health", timeout=aiohttp.ClientTimeout(total=0.2))

    await control.node_health("u0", 1, "ok")
    assert (await _health(session, follower))[0] == 200


async def test_client_disconnect_is_recorded(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.settings("u0", itl_ms=50, tokens=100)
    resp = await session.post(cluster.units[0].leader_url + "/v1/chat/completions", json=STREAM)
    await resp.content.readline()  # the first event is out: the stream is running
    closed_at = time.time()
    resp.close()
    stats = await control.wait_stats("u0", lambda s: s["cancelled"] == 1)
    assert stats["in_flight"] == 0 and stats["completed"] == 0
    assert 0 <= stats["last_cancel_time"] - closed_at < 0.5
    step = stats["step"]
    assert step < 100  # the stream stopped instead of running to the end unobserved
    assert (await control.stats("u0"))["step"] == step


async def test_reset_restores_everything(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.settings("u0", ttft_ms=999, tools="text", variant="r2")
    await control.fault("u0", "refuse")
    await control.node_health("u0", 1, "unhealthy")
    await control.fault("u1", "error", status=500)
    async with session.post(cluster.units[1].leader_url + "/v1/completions", json={}) as resp:
        assert resp.status == 400  # no prompt: rejected before admission, not counted
    await control.reset()
    units = await control.units()
    for unit in units:
        assert unit["fault"]["mode"] == "none"
        assert unit["settings"] == {
            "ttft_ms": 5.0,
            "itl_ms": 1.0,
            "tokens": 8,
            "tools": "call",
            "variant": "",
            "stall_rate": 0.0,
            "stall_ms": 0.0,
        }
        assert {h["mode"] for h in unit["health"]} == {"ok"}
        assert unit["stats"]["requests"] == 0
    async with session.post(
        cluster.units[0].leader_url + "/v1/completions", json={"prompt": "a"}
    ) as resp:
        assert resp.status == 200
