"""Relaying a streamed answer from a unit's connection to the client.

The unit's body bytes go from the upstream connection's read callback straight to the
client's transport (re-framed as HTTP chunks, SSE bytes unchanged): no parsing of events, no
task wake-up per token. The request task sleeps until the answer ends, the client's send
buffer fills (then it waits for the client to drain while upstream reading is paused), or
something fails.

Once the first byte has reached the client a failure can no longer be retried; the client
then gets an explicit SSE `error` event instead of a silent truncation.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from gateway.errors import error_body
from gateway.observability.histogram import Histogram
from gateway.proxy.connection import ConnectionBroken, UpstreamConnection
from gateway.proxy.upstream import Answer

# Pause reading from the unit while the client has this much unsent data.
HIGH_WATER = 256 * 1024


@dataclass(slots=True)
class Outcome:
    """How a relayed stream ended: `complete`, `client_gone`, or an upstream failure kind."""

    kind: str
    response: web.StreamResponse


class IdleTimeout(Exception):
    pass


class _Pump:
    """Called by the upstream connection for every read; writes to the client at once."""

    __slots__ = ("client", "conn", "done", "gone", "itl", "last", "loop", "paused")

    def __init__(self, conn: UpstreamConnection, client: asyncio.Transport, itl: Histogram) -> None:
        self.conn = conn
        self.client = client
        self.itl = itl
        self.loop = conn.loop
        self.last = self.loop.time()
        self.done = self.gone = self.paused = False

    def push(self, pieces: list[bytes], complete: bool) -> None:
        if self.client.is_closing():
            self.gone = True
            self.conn.abort()
            self.conn.wake()
            return
        if pieces:
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self.client.write(b"%x\r\n%b\r\n" % (len(data), data))
            now = self.loop.time()
            self.itl.observe(now - self.last)
            self.last = now
        if complete:
            self.done = True
            self.conn.wake()
        elif self.client.get_write_buffer_size() > HIGH_WATER:
            assert self.conn.transport is not None
            self.conn.transport.pause_reading()
            self.paused = True
            self.conn.wake()

    def settled(self) -> bool:
        return self.done or self.gone or self.paused


async def relay_stream(
    request: web.BaseRequest,
    answer: Answer,
    headers: dict[str, str],
    deadline: float,
    idle: float,
    itl: Histogram,
) -> Outcome:
    conn = answer.connection
    assert conn is not None and request.transport is not None
    out = web.StreamResponse(status=answer.status, headers=headers)
    out.content_type = answer.content_type.split(";")[0]
    writer = await out.prepare(request)
    assert writer is not None
    try:
        await out.write(answer.first)  # sends the head together with the first bytes
    except ConnectionError:
        return Outcome("client_gone", out)
    pump = _Pump(conn, request.transport, itl)
    conn.sink = pump.push
    if conn.body or conn.complete:  # arrived while the head was being sent
        pieces, conn.body = conn.body, []
        pump.push(pieces, conn.complete)
    watchdog = _IdleWatchdog(conn, pump, idle)
    try:
        async with asyncio.timeout_at(deadline):
            while True:
                await conn.wait_for(pump.settled)
                if not pump.paused:
                    break
                await writer.drain()
                pump.paused = False
                assert conn.transport is not None
                conn.transport.resume_reading()
    except (ConnectionBroken, IdleTimeout) as exc:
        kind = "idle_timeout" if isinstance(exc, IdleTimeout) else "reset"
        return await _end_with_error(out, kind, str(exc))
    except ConnectionError:  # the client's side, while draining
        return Outcome("client_gone", out)
    except TimeoutError:
        return await _end_with_error(
            out, "total_timeout", "the answer exceeded the total time limit"
        )
    finally:
        watchdog.cancel()
        conn.sink = None
    if pump.gone:
        return Outcome("client_gone", out)
    await out.write_eof()
    return Outcome("complete", out)


class _IdleWatchdog:
    """One timer per stream, re-armed lazily: no timer churn per token."""

    def __init__(self, conn: UpstreamConnection, pump: _Pump, idle: float) -> None:
        self.conn, self.pump, self.idle = conn, pump, idle
        self.handle = conn.loop.call_at(conn.loop.time() + idle, self._check)

    def _check(self) -> None:
        loop = self.conn.loop
        quiet_since = max(self.conn.last_data, self.pump.last)
        if self.pump.paused or loop.time() - quiet_since < self.idle:
            self.handle = loop.call_at(
                max(quiet_since + self.idle, loop.time() + 0.01), self._check
            )
            return
        self.conn.fail(IdleTimeout(f"the unit sent nothing for {self.idle:g} s"))

    def cancel(self) -> None:
        self.handle.cancel()


async def _end_with_error(out: web.StreamResponse, kind: str, message: str) -> Outcome:
    try:
        await out.write(b"data: " + error_body(message, "upstream_error", code=kind) + b"\n\n")
        await out.write_eof()
    except ConnectionError:
        return Outcome("client_gone", out)
    return Outcome(kind, out)
