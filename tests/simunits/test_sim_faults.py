"""Injected faults: each mode fails the way the gateway must learn to cope with."""

from __future__ import annotations

import asyncio
import errno

import aiohttp
import orjson
import pytest

from loadtest.simunits import SimCluster
from loadtest.simunits.client import ControlClient, ControlError, sse_data

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**CHAT, "stream": True}


def chat_url(cluster: SimCluster, index: int = 0) -> str:
    return cluster.units[index].leader_url + "/v1/chat/completions"


async def test_error_with_count_reverts(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.fault("u0", "error", status=503, count=2)
    for _ in range(2):
        async with session.post(chat_url(cluster), json=STREAM) as resp:
            assert resp.status == 503
            error = (await resp.json())["error"]
            assert error["type"] == "server_error"
    async with session.post(chat_url(cluster), json=CHAT) as resp:
        assert resp.status == 200
    stats = await control.stats("u0")
    assert (stats["requests"], stats["failed"], stats["completed"]) == (3, 2, 1)
    assert (await control.units())[0]["fault"]["mode"] == "none"


async def test_refuse_then_rebind_same_port(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    async with session.post(chat_url(cluster), json=CHAT) as resp:  # leaves a pooled connection
        assert resp.status == 200
    await control.fault("u0", "refuse")
    for _ in range(2):  # the pooled connection was closed too, so every attempt is refused
        with pytest.raises(aiohttp.ClientConnectorError) as info:
            await session.post(chat_url(cluster), json=CHAT)
        assert info.value.os_error.errno == errno.ECONNREFUSED
    async with session.post(chat_url(cluster, 1), json=CHAT) as resp:
        assert resp.status == 200  # other units are unaffected
    await control.fault("u0", "none")
    async with session.post(chat_url(cluster), json=CHAT) as resp:
        assert resp.status == 200


async def test_hang_until_client_gives_up(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.fault("u0", "hang")
    timeout = aiohttp.ClientTimeout(total=0.2)
    with pytest.raises(asyncio.TimeoutError):
        await session.post(chat_url(cluster), json=STREAM, timeout=timeout)
    stats = await control.wait_stats("u0", lambda s: s["cancelled"] == 1)
    assert stats["in_flight"] == 0 and stats["last_cancel_time"] is not None


async def test_stall_freezes_stream_and_step(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient
) -> None:
    await control.fault("u0", "stall", after_tokens=3, count=1)
    resp = await session.post(chat_url(cluster), json=STREAM)
    events = sse_data(resp)
    seen = [await anext(events) for _ in range(4)]  # role chunk + 3 tokens
    assert b'"tok2 "' in seen[-1]
    step = cluster.units[0].state.stats.step
    # A second request on the same unit is frozen too: the whole unit is stuck.
    other = await session.post(chat_url(cluster), json=STREAM)
    for pending in (anext(events), other.content.readany()):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pending, 0.2)
    async with session.get(cluster.units[0].node_urls[1] + "/health") as health:
        assert (await health.json())["step"] == step
    resp.close()  # the client gives up on the stalled request; the unit moves again
    body = await other.read()
    assert body.endswith(b"data: [DONE]\n\n")
    await control.wait_stats("u0", lambda s: s["cancelled"] == 1 and s["completed"] == 1)


@pytest.mark.parametrize("stream", [True, False])
async def test_drop_breaks_the_transfer(
    cluster: SimCluster, session: aiohttp.ClientSession, control: ControlClient, stream: bool
) -> None:
    await control.fault("u0", "drop", after_tokens=2)
    seen: list[bytes] = []
    with pytest.raises(aiohttp.ClientError):
        async with session.post(chat_url(cluster), json={**CHAT, "stream": stream}) as resp:
            async for data in sse_data(resp):
                seen.append(data)
    if stream:
        assert [orjson.loads(d)["choices"][0]["delta"].get("content") for d in seen] == [
            "",
            "tok0 ",
            "tok1 ",
        ]
    stats = await control.wait_stats("u0", lambda s: s["in_flight"] == 0)
    assert stats["failed"] == 1 and stats["cancelled"] == 0


@pytest.mark.parametrize(
    ("mode", "params", "field"),
    [
        ("explode", {}, "mode"),
        ("refuse", {"count": 1}, "count"),
        ("stall", {"after_tokens": -1}, "after_tokens"),
        ("hang", {"status": 500}, "status"),
        ("error", {"status": 200}, "status"),
        ("error", {"count": 0}, "count"),
        ("drop", {"rate": 0}, "rate"),
        ("drop", {"rate": 1.5}, "rate"),
        ("drop", {"rate": True}, "rate"),
        ("error", {"rate": "0.1"}, "rate"),
        ("error", {"rate": 0.1, "count": 3}, "rate"),
        ("error", {"seed": 3}, "seed"),
        ("error", {"rate": 0.1, "seed": 1.5}, "seed"),
        ("refuse", {"rate": 0.5}, "rate"),
        ("none", {"rate": 0.5}, "rate"),
    ],
)
async def test_bad_fault_params_are_rejected(
    control: ControlClient, mode: str, params: dict[str, object], field: str
) -> None:
    with pytest.raises(ControlError) as info:
        await control.fault("u0", mode, **params)
    body = info.value.body
    assert info.value.status == 400
    assert isinstance(body, dict) and body["field"] == field and field in body["error"]
    assert (await control.units())[0]["fault"]["mode"] == "none"


async def test_unknown_unit_and_rank_are_404(control: ControlClient) -> None:
    for call in (control.stats("nope"), control.node_health("u0", 7, "ok")):
        with pytest.raises(ControlError) as info:
            await call
        assert info.value.status == 404
