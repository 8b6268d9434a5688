"""The lean front's lingering close on real sockets: a refusal written before the body was
read reaches a client still sending it, and what the client sends after is read and dropped
within bounds (bytes, time, quiet), never kept; the gateway's shutdown ends it too."""

from __future__ import annotations

import asyncio
import contextlib
import time
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from gateway.front.linger import LINGER_BYTES, LINGER_IDLE_S, LINGER_S, LingerLimits
from gateway.front.request import LeanRequest
from gateway.front.server import Front
from tests.gateway.front.test_front import Client, post, serving
from tests.gateway.servers import until

MIB = 1024 * 1024
HUGE = 1 << 40  # a Content-Length no client finishes sending


async def _refuse(request: LeanRequest) -> web.StreamResponse:
    """As the gateway refuses a caller without a key: before reading the body."""
    return web.json_response({"error": {"code": "unauthorized"}}, status=401)


def _urllib_status(url: str, body: bytes) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_a_refusal_before_the_body_reaches_a_client_that_sends_it_all_first() -> None:
    async with serving({"/refuse": _refuse}) as (port, front):
        url = f"http://127.0.0.1:{port}/refuse"
        status = await asyncio.to_thread(_urllib_status, url, b"x" * (64 * MIB))
        assert status == 401
        await until(lambda: not front.lingering, 5.0, "the lingering close ends")


@contextlib.asynccontextmanager
async def refused(
    limits: LingerLimits, length: int = HUGE
) -> AsyncIterator[tuple[Client, Front, float]]:
    """A connection whose request (`length` bytes of body declared) was refused on its
    head: the client has read the 401 and the end of the answers (the server shut its write
    side); yields it, the front, and when the request was sent (before the lingering began)."""
    async with serving({"/refuse": _refuse}, linger=limits) as (port, front):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = Client(reader, writer)
        try:
            sent = time.monotonic()
            writer.write(post("/refuse").replace(b"Length: 0", b"Length: %d" % length))
            status, headers, _ = await client.answer()
            assert (status, headers["connection"]) == (401, "close")
            assert await client.closed()  # the answers' end; the server still reads
            assert len(front.lingering) == 1
            yield client, front, sent
        finally:
            writer.close()


async def _send_until_cut(client: Client, chunk: bytes, pause: float, most: int) -> int:
    """Send `chunk` after `chunk` (`pause` s apart) until the server cuts the connection;
    the bytes sent. Fails past `most` bytes."""
    sent = 0
    with contextlib.suppress(ConnectionError):
        while not client.writer.transport.is_closing():
            assert sent < most, f"still not cut off after {sent} bytes"
            client.writer.write(chunk)
            await client.writer.drain()
            sent += len(chunk)
            await asyncio.sleep(pause)
    return sent


async def test_a_client_that_never_stops_is_cut_off_past_the_bytes_with_memory_flat() -> None:
    limits = LingerLimits(seconds=60.0, idle=30.0, bytes=32 * MIB)
    tracemalloc.start()
    try:
        async with refused(limits) as (client, front, _):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            sent = await _send_until_cut(client, b"x" * 65536, 0.0, 512 * MIB)
            peak = tracemalloc.get_traced_memory()[1] - before
            await until(lambda: not front.lingering, 5.0, "the lingering close ends")
    finally:
        tracemalloc.stop()
    assert sent > limits.bytes
    assert peak < 4 * MIB, f"{peak} bytes held while {sent} were dropped"


async def test_a_client_that_never_stops_is_cut_off_after_the_time() -> None:
    limits = LingerLimits(seconds=0.5, idle=30.0, bytes=HUGE)
    async with refused(limits) as (client, front, sent):
        await _send_until_cut(client, b"x" * 1024, 0.02, 64 * MIB)
        took = time.monotonic() - sent
        await until(lambda: not front.lingering, 5.0, "the lingering close ends")
    assert 0.45 < took < 5.0


async def test_a_quiet_client_is_closed_after_the_idle_time() -> None:
    limits = LingerLimits(seconds=60.0, idle=0.3, bytes=HUGE)
    async with refused(limits) as (client, front, _):
        wrote = time.monotonic()
        client.writer.write(b"x" * 1000)  # the last bytes: 0.3 s of quiet from here
        await until(lambda: not front.lingering, 5.0, "the lingering close ends")
        assert time.monotonic() - wrote > 0.25


async def test_the_client_closing_its_side_ends_the_lingering_close() -> None:
    limits = LingerLimits(seconds=60.0, idle=60.0, bytes=HUGE)
    async with refused(limits, length=1000) as (client, front, _):
        client.writer.write(b"x" * 1000)
        client.writer.write_eof()
        await until(lambda: not front.lingering, 5.0, "the lingering close ends")


async def test_shutdown_ends_a_lingering_close_within_its_grace() -> None:
    limits = LingerLimits(seconds=60.0, idle=60.0, bytes=HUGE)
    async with refused(limits) as (client, front, _):
        sending = asyncio.create_task(_send_until_cut(client, b"x" * 1024, 0.02, 64 * MIB))
        try:
            started = time.monotonic()
            await asyncio.wait_for(front.shutdown(0.2), 5.0)
            assert 0.15 < time.monotonic() - started < 5.0
            assert not front.lingering
            await asyncio.wait_for(sending, 5.0)  # the client saw it cut
        finally:
            sending.cancel()


def test_the_docs_give_the_lingering_bounds() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "relay.md").read_text()
    text = " ".join(page.split())
    for bound in (f"{LINGER_IDLE_S:g} s", f"{LINGER_S:g} s", f"{LINGER_BYTES // MIB} MiB"):
        assert bound in text, f"docs/relay.md does not say {bound!r}"
