"""One client connection on the lean front.

It reads each request's head itself (head.py). A request it serves runs as one task, the
route's handler, with a LeanRequest (request.py) as its exchange; its answer goes straight to
the transport. Anything else (another route, a method, a coding or an expectation it leaves
alone, a head it cannot parse) is handed to aiohttp with every byte of it read so far: the
connection becomes an aiohttp `RequestHandler` and stays one.

Requests on a connection are answered one at a time, in order: bytes of the next one that
arrive while one is in flight wait (reading paused) until it is answered. The keep-alive timer
runs only between requests and before the first; a connection idle that long is closed. It
is armed once and, when it fires, looks at when the connection last went quiet: a request
neither arms nor cancels a loop timer (a timer a request cost a few microseconds of CPU).

An answer that ends the connection while the request's body is still coming (a refusal written
before the body was read: 413 on its length, 401) hands the connection to a lingering
close (linger.py), which reads and drops the rest for a bounded time before closing, so the
client reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from aiohttp import web

from gateway.base.loop import KeepsLoop
from gateway.base.net import head_end
from gateway.front.head import MAX_HEAD, QuickHead, read_head
from gateway.front.linger import Linger, LingerLimits
from gateway.front.reply import server_error, whole
from gateway.front.request import LeanRequest

log = logging.getLogger("unitgate.front")

# A route's handler, as the lean front calls it.
LeanRoute = Callable[[LeanRequest], Coroutine[Any, Any, web.StreamResponse]]


class Listener(Protocol):
    """What the connections of one listener share (server.py's Front)."""

    routes: Mapping[bytes, LeanRoute]
    fallback: Callable[[], asyncio.Protocol]  # aiohttp's RequestHandler for one connection
    keepalive: float
    cors: bool
    quick: QuickHead | None  # head.py's reader of common heads, compiled (None: Python only)
    connections: set[FrontProtocol]
    linger: LingerLimits
    lingering: set[Linger]  # connections in their lingering close
    closing: bool


class FrontProtocol(asyncio.Protocol, KeepsLoop):
    __slots__ = (
        "_drain",
        "_idle",
        "_paused",
        "_quiet_since",
        "buf",
        "front",
        "request",
        "task",
        "transport",
    )

    def __init__(self, front: Listener) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.buf = b""  # the next request's bytes so far
        self.request: LeanRequest | None = None  # the one in flight
        self.task: asyncio.Task[web.StreamResponse] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._quiet_since = 0.0  # loop time the last answer ended (or the connection came)
        self._loop = None
        self._paused = False  # reading, while the next request's bytes wait
        self._drain: asyncio.Future[None] | None = None  # set while writing is paused

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self._bind_loop()
        self.front.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        request = self.request
        if request is not None:  # body bytes, then perhaps the next request's
            missing = request.missing
            if missing:
                body = data if len(data) <= missing else data[:missing]
                request.feed(body)
                data = data[len(body) :]
            if data:
                self.buf += data
                self._pause()
            return
        self.buf = self.buf + data if self.buf else data
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.connections.discard(self)
        self.transport = None
        self._cancel_idle()
        self.resume_writing()  # a writer waiting to drain finds the transport gone
        if self.request is not None:
            self.request.lost()
        if self.task is not None:
            self.task.cancel()  # as aiohttp's handler_cancellation: the client left

    def pause_writing(self) -> None:
        if self._drain is None:
            self._drain = (self._loop or self._bind_loop()).create_future()

    def resume_writing(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drained(self) -> None:
        """Until the transport's write buffer is below its low mark again."""
        drain = self._drain
        if drain is not None:
            await asyncio.shield(drain)

    # -- requests -------------------------------------------------------------------------

    def _next(self) -> None:
        """Start on the request whose bytes are in `buf`, once its head is whole."""
        buf = self.buf
        end = head_end(buf)
        if end == -1:
            if len(buf) > MAX_HEAD:
                self._hand_over()
            return  # more to come (the keep-alive timer bounds the wait)
        if self.front.closing:  # as aiohttp does at shutdown: no new request on an idle one
            assert self.transport is not None
            self.transport.close()
            return
        front = self.front
        head = read_head(buf[:end], front.routes, front.cors, front.quick)
        if head is None:
            self._hand_over()
            return
        request = LeanRequest(self, head)
        rest = buf[end:]
        if rest:
            body = rest[: head.length]
            request.feed(body)
            rest = rest[len(body) :]
        self.buf = rest
        if rest:
            self._pause()
        self.request = request
        route = self.front.routes[head.path]
        self.task = task = (self._loop or self._bind_loop()).create_task(route(request))
        task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task[web.StreamResponse]) -> None:
        request, self.request, self.task = self.request, None, None
        transport = self.transport
        assert request is not None
        if transport is None or transport.is_closing() or task.cancelled():
            if transport is not None:
                transport.close()
            return
        keep_alive = request.keep_alive and not self.front.closing
        exc = task.exception()
        try:
            if exc is not None:
                log.error("the lean front's handler failed", exc_info=exc)
                if request.head_sent and not request.take_head():
                    keep_alive = False  # a broken stream: nothing can follow it
                else:  # nothing went out yet (a streamed answer's head may have been kept)
                    transport.write(server_error(keep_alive))
            elif not request.head_sent:
                transport.write(whole(task.result(), keep_alive))
        except Exception:
            log.exception("the lean front could not answer")
            keep_alive = False
        if not keep_alive:
            self._close(request, transport)
            return
        self._arm_idle()  # the quiet starts now
        if self._paused:
            self._paused = False
            transport.resume_reading()
        if self.buf:
            self._next()

    def _close(self, request: LeanRequest, transport: asyncio.Transport) -> None:
        """After the request's answer: closed, or lingering if its body is still coming."""
        if not request.missing or transport.is_closing():
            transport.close()
            return
        self._leave()
        Linger(transport, self.front.linger, self.front.lingering)

    def _leave(self) -> None:
        """The connection is another protocol's from now on."""
        self._cancel_idle()
        self.front.connections.discard(self)
        self._paused = False  # the next protocol reads
        self.buf = b""
        self.transport = None

    def _hand_over(self) -> None:
        """The connection becomes aiohttp's, with the bytes of the request read so far."""
        transport = self.transport
        assert transport is not None
        data, paused = self.buf, self._paused
        self._leave()
        handler = self.front.fallback()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if paused:
            transport.resume_reading()
        if data:
            handler.data_received(data)

    def _pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    # -- the keep-alive timer -------------------------------------------------------------

    def _arm_idle(self) -> None:
        """The connection goes quiet now: closed once it stays so for the keep-alive time (the
        timer of an earlier quiet, still armed, looks again when it fires)."""
        loop = self._loop or self._bind_loop()
        self._quiet_since = now = loop.time()
        if self._idle is None:
            self._idle = loop.call_at(now + self.front.keepalive, self._idle_out)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_out(self) -> None:
        self._idle = None
        if self.request is not None:
            return  # busy: its answer's end arms the timer again
        due = self._quiet_since + self.front.keepalive
        loop = self._loop or self._bind_loop()
        if loop.time() < due:  # a request came and went since the timer was armed
            self._idle = loop.call_at(due, self._idle_out)
            return
        self.close_idle()

    def close_idle(self) -> None:
        """At shutdown: close the connection unless a request is in flight on it."""
        if self.request is None and self.transport is not None:
            self.transport.close()
