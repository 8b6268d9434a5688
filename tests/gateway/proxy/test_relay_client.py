"""The stream relay seen from a client that misbehaves (the harness of test_relay.py, in
tests/gateway/proxy/relay_support.py): one that leaves is CLIENT_GONE and its unit is cut off; one
that does not read pauses the unit's reads (back-pressure) until it drains, without counting as
idle, and leaving while not reading is CLIENT_GONE too."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from gateway.outcomes import End
from gateway.proxy.upstream import Answer, UpstreamClient
from gateway.relay.pump import HIGH_WATER
from tests.gateway.proxy.relay_support import (
    FIRST,
    LAST_CHUNK,
    Relayed,
    chunk,
    next_chunk,
    starts_with,
    stream_of,
)
from tests.gateway.servers import RawServer, until

pytestmark = pytest.mark.both_relays


async def test_a_client_that_leaves_is_client_gone_and_its_unit_is_cut_off(
    upstream: UpstreamClient,
) -> None:
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url)
        # No handler cancellation (aiohttp's default; the gateway turns it on): the relay
        # itself notices the client gone, at the next bytes the unit sends.
        async with stream_of(relayed, handler_cancellation=False) as resp:
            assert await next_chunk(resp) == FIRST
            assert resp.connection is not None and resp.connection.transport is not None
            resp.connection.transport.abort()  # the client vanishes
            client = relayed.client
            assert client is not None
            await until(client.is_closing, 2.0, "the gateway sees the client gone")
            assert not relayed.ended.done()  # nothing to relay yet: nothing noticed
            unit.peers[0].write(chunk(b'data: {"n": 2}\n\n'))
            assert await relayed.end() is End.CLIENT_GONE
        assert relayed.unit_closed  # cut off by the pump, before the handler's finish
        await asyncio.wait_for(unit.peers[0].closed.wait(), 1.0)


SIZE, PIECE = 2 * 1024 * 1024, 64 * 1024  # 2 MiB in 64 KiB chunks: pauses after < 1 MiB


def payload() -> list[bytes]:
    return [bytes([65 + i % 26]) * PIECE for i in range(SIZE // PIECE)]


def small_send_buffer(relayed: Relayed) -> Callable[[Answer], Awaitable[None]]:
    """Shrinks the kernel's send buffer towards the client, so that what a client that does
    not read leaves unsent piles up in the gateway after a few hundred KiB, not megabytes."""

    async def shrink(answer: Answer) -> None:
        assert relayed.client is not None
        sock = relayed.client.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    return shrink


async def test_a_client_that_does_not_read_pauses_the_unit_until_it_drains(
    upstream: UpstreamClient,
) -> None:
    pieces = payload()
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url, idle=0.2)
        relayed.before_pump = small_send_buffer(relayed)
        async with stream_of(relayed, read_bufsize=4096) as resp:
            assert await next_chunk(resp) == FIRST
            unit.peers[0].write(b"".join(map(chunk, pieces)) + LAST_CHUNK)
            answer, client = relayed.answer, relayed.client
            assert answer is not None and client is not None
            conn = answer.connection
            assert conn is not None and conn.transport is not None
            transport = conn.transport
            await until(lambda: not transport.is_reading(), 2.0, "upstream reading paused")
            assert client.get_write_buffer_size() > HIGH_WATER
            # Paused for longer than the idle time (0.2 s): not idle, the client is slow.
            await asyncio.sleep(0.4)
            assert not relayed.ended.done() and not transport.is_reading()
            assert not conn.complete  # the unit's bytes wait upstream, not in the gateway
            body = await asyncio.wait_for(resp.read(), 5.0)  # the client drains: it resumes
            assert await relayed.end() is End.COMPLETE
        assert body == b"".join(pieces)


async def test_a_client_that_leaves_while_not_reading_is_client_gone(
    upstream: UpstreamClient,
) -> None:
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url)
        relayed.before_pump = small_send_buffer(relayed)
        async with stream_of(relayed, handler_cancellation=False, read_bufsize=4096) as resp:
            assert await next_chunk(resp) == FIRST
            unit.peers[0].write(b"".join(map(chunk, payload())))
            answer = relayed.answer
            assert answer is not None and answer.connection is not None
            transport = answer.connection.transport
            assert transport is not None
            await until(lambda: not transport.is_reading(), 2.0, "upstream reading paused")
            assert resp.connection is not None and resp.connection.transport is not None
            resp.connection.transport.abort()
            assert await relayed.end() is End.CLIENT_GONE
        await asyncio.wait_for(unit.peers[0].closed.wait(), 1.0)
