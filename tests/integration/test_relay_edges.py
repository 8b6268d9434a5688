"""Edges of the stream relay: timeouts mid-stream, odd upstream framing, slow clients, reuse."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest

from gateway.server import running
from tests.support import SimProcess, chat_body, gateway_config, session_ranking_first

pytestmark = pytest.mark.both_relays

CHAT = "/v1/chat/completions"
Responder = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_unit(respond: Responder) -> AsyncIterator[dict[str, object]]:
    """A hand-written HTTP server on an OS-assigned port, for framings the sim never uses."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # our requests carry a small JSON body: drain it
        await reader.read(65536)
        await respond(reader, writer)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    try:
        yield {"id": "raw", "leader": url, "nodes": [url]}
    finally:
        server.close()
        await server.wait_closed()


EVENTS = b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"


async def test_content_length_and_close_delimited_streams(http: aiohttp.ClientSession) -> None:
    async def with_length(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        w.write(b"Content-Length: %d\r\n\r\n" % len(EVENTS) + EVENTS[:11])
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(EVENTS[11:])
        await w.drain()

    async def close_delimited(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        w.write(EVENTS[:11])
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(EVENTS[11:])
        await w.drain()

    for respond in (with_length, close_delimited):
        async with (
            raw_unit(respond) as unit,
            running(gateway_config([unit])) as gw,
            http.post(gw.public_url + CHAT, json=chat_body()) as resp,
        ):
            assert resp.status == 200
            assert await resp.read() == EVENTS


async def test_garbage_from_a_unit_is_retried_elsewhere(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async def garbage(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"SMTP ready\r\n\r\n")
        await w.drain()

    async with raw_unit(garbage) as bad:
        good = clean_sim.units[0]
        routing = {"affinity": "session"}
        config = gateway_config([bad, good], retry={"budget_min_per_second": 10.0}, routing=routing)
        # A session whose favourite is the bad unit: the first attempt goes there every time.
        headers = {"x-session-id": session_ranking_first(bad["id"], [good["id"]])}
        async with running(config) as gw:
            for _ in range(6):
                async with http.post(
                    gw.public_url + CHAT, json=chat_body(), headers=headers
                ) as resp:
                    assert resp.status == 200
                    assert resp.headers["x-unitgate-unit"] == good["id"]
                    await resp.read()
            assert 'unitgate_retries_total{kind="protocol"}' in gw.metrics.render().decode()


async def test_idle_timeout_mid_stream_ends_with_an_error_event(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    config = gateway_config(clean_sim.units[:1], timeouts={"idle": 0.3})
    async with running(config) as gw:
        clean_sim.fault("u0", "stall", after_tokens=2)
        async with http.post(gw.public_url + CHAT, json=chat_body()) as resp:
            text = await resp.text()
        assert "tok1 " in text and "tok2 " not in text
        assert text.endswith('"code":"idle_timeout"}}\n\ndata: [DONE]\n\n')
        metrics = gw.metrics.render().decode()
        assert 'unitgate_upstream_failures_total{kind="idle_timeout",unit="u0"} 1.0' in metrics
        assert gw.units.units["u0"].inflight == 0


async def test_total_timeout_bounds_streams_and_whole_answers(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    clean_sim.post("/units/u0/settings", {"itl_ms": 100, "tokens": 30})
    config = gateway_config(clean_sim.units[:1], timeouts={"total": 0.5})
    async with running(config) as gw:
        async with http.post(gw.public_url + CHAT, json=chat_body()) as resp:
            text = await resp.text()
        assert text.endswith('"code":"total_timeout"}}\n\ndata: [DONE]\n\n')
        clean_sim.fault("u0", "hang")
        async with http.post(gw.public_url + CHAT, json=chat_body(stream=False)) as resp:
            assert resp.status == 504
            assert (await resp.json())["error"]["code"] == "first_byte_timeout"


async def test_slow_client_gets_every_byte(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    clean_sim.post("/units/u0/settings", {"ttft_ms": 0, "itl_ms": 0, "tokens": 3000})
    async with running(gateway_config(clean_sim.units[:1])) as gw:
        body = chat_body(max_tokens=3000)
        async with http.post(
            gw.public_url + CHAT, json=body, headers={"x-request-id": "slow"}
        ) as resp:
            first = await resp.content.readany()
            await asyncio.sleep(0.5)  # the client stops reading; the gateway must not buffer it all
            relayed = first + await resp.read()
        leader = clean_sim.units[0]["leader"]
        async with http.post(leader + CHAT, json=body, headers={"x-request-id": "slow"}) as resp:
            direct = await resp.read()
        assert relayed == direct
        assert relayed.endswith(b"data: [DONE]\n\n") and len(relayed) > 300_000


async def test_keep_alive_connections_are_reused(
    clean_sim: SimProcess, http: aiohttp.ClientSession
) -> None:
    async with running(gateway_config(clean_sim.units[:1])) as gw:
        for stream in (True, False) * 5:
            async with http.post(gw.public_url + CHAT, json=chat_body(stream=stream)) as resp:
                assert resp.status == 200
                await resp.read()
        assert gw._upstream is not None
        assert len(gw._upstream.pool._all) == 1
