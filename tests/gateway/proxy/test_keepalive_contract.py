"""What the request handler relies on when it cancels aiohttp's keep-alive timer for the life of
a request (`request.protocol.keep_alive(True)`, handler.py): aiohttp arms it again when the
request ends, so an idle keep-alive connection is still closed after `keepalive_timeout`, and
a client that asked for `Connection: close` still gets its connection closed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from tests.gateway.servers import serve_app

pytestmark = pytest.mark.both_relays

KEEPALIVE_S = 0.3


async def _handle(request: web.Request) -> web.StreamResponse:
    request.protocol.keep_alive(True)
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"data: 1\n\n")
    await response.write_eof()
    return response


@pytest.fixture
async def port() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_get("/", _handle)
    async with serve_app(app, keepalive_timeout=KEEPALIVE_S) as url:
        yield int(url.rsplit(":", 1)[1])


async def _request(
    writer: asyncio.StreamWriter, reader: asyncio.StreamReader, close: bool
) -> bytes:
    extra = b"Connection: close\r\n" if close else b""
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5.0)
    return head + body


async def test_an_idle_connection_is_still_closed_after_the_keepalive_timeout(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(2):  # kept alive between requests
            assert b"data: 1" in await _request(writer, reader, close=False)
        idle_from = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # the server closed it
        assert time.monotonic() - idle_from >= KEEPALIVE_S - 0.05
    finally:
        writer.close()


async def test_connection_close_is_still_honoured(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answer = await _request(writer, reader, close=True)
        assert b"data: 1" in answer
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        assert time.monotonic() - started < KEEPALIVE_S  # at once, not after the timeout
    finally:
        writer.close()
