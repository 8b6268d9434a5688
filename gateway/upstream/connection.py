"""Raw HTTP/1.1 keep-alive connections to leaders, parsed with httptools.

Why not aiohttp's client: it parses and de-chunks each upstream read into a StreamReader and
wakes the handler task once per SSE event; the server side then re-chunks it. On a 64-token
stream that is most of the gateway's CPU. Here the connection's own `data_received` callback
hands body bytes straight to a sink (the client's transport, see pump.py), with no task
switch per event, and the request task sleeps until the answer ends or needs attention.

With the native relay (gateway/relay/native), httptools parses only the answer's head: the body's
bytes go to a compiled `Reader`, one call per read, which de-frames them and, once a relay has
attached, relays them to the client itself and returns flags only when something happened.
The connection's protocol is then the compiled `Tap` (`tapped`), which hands each read of the
body to the Reader itself: this class's `data_received` runs for the head alone, and
`_native_flags` only for a read that needs Python.

A connection serves one request at a time; pool.py keeps idle ones per leader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httptools

from gateway.base.net import head_end

if TYPE_CHECKING:
    from gateway.relay.native import Relay, _relay

# (body pieces, answer complete) -> None; called from data_received while relaying.
Sink = Callable[[list[bytes], bool], None]
# The native relay's flags -> None; called from data_received when a read needs Python.
FlagSink = Callable[[int], None]

# The answer headers anything reads (the framing, and the type: SSE or not).
_HEADERS_READ = frozenset((b"content-type", b"content-length", b"transfer-encoding"))

# The longest answer head the native path waits for (httptools' own bound is about 80 KB).
MAX_HEAD = 64 * 1024


def tapped(conn: UpstreamConnection) -> Any:
    """The protocol to connect `conn` with: with the native relay, the compiled `Tap` in front
    of it, which reads the answer's body with no Python frame per read; else `conn` itself."""
    return conn if conn.native is None else conn.native.Tap(conn)


def connection_of(protocol: Any) -> UpstreamConnection:
    """The connection behind what `tapped` gave."""
    conn: UpstreamConnection = (
        protocol if isinstance(protocol, UpstreamConnection) else protocol.conn
    )
    return conn


class ConnectionBroken(ConnectionError):
    """The connection closed or sent something that is not HTTP."""


class UpstreamConnection(asyncio.Protocol):
    __slots__ = (  # one per open stream: no instance dict
        "_head",
        "_head_keep_alive",
        "_waiter",
        "body",
        "closed",
        "complete",
        "error",
        "events",
        "head_done",
        "headers",
        "idle_since",
        "keep_alive",
        "last_data",
        "loop",
        "native",
        "parser",
        "reader",
        "sink",
        "status",
        "tls",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, native: Relay | None = None) -> None:
        self.loop = loop
        self.native = native  # the compiled relay (gateway/relay/native); None: all in httptools
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.tls = False
        self.idle_since = 0.0
        self.reset()

    def reset(self) -> None:
        # The native path makes one only for a head its own reader leaves (relay/native/
        # heads.c), and drops it once it has the head: the Reader reads the rest.
        self.parser: httptools.HttpResponseParser | None = (
            httptools.HttpResponseParser(self) if self.native is None else None
        )
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.body: list[bytes] = []
        self.sink: Sink | None = None
        self.last_data = 0.0
        self._waiter: asyncio.Future[None] | None = None
        # The native path: the body's Reader once the head is in, the head's bytes until then,
        # whether the head allows keep-alive, and the attached relay's flag sink.
        self.reader: _relay.Reader | None = None
        self.events: FlagSink | None = None
        self._head = b""
        self._head_keep_alive = False

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.tls = transport.get_extra_info("sslcontext") is not None

    def data_received(self, data: bytes) -> None:
        self.last_data = now = self.loop.time()
        reader = self.reader
        if reader is not None:  # the Tap does this in C (the reference it is tested against)
            flags = reader.feed(data, now)
            if flags or self.events is None:  # no relay yet: the request task may be waiting
                self._native_flags(flags)
            return
        if self.native is not None:
            self._native_head(data)
            return
        parser = self.parser
        assert parser is not None
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(ConnectionBroken(f"invalid HTTP from the unit: {exc}"))
            self.abort()
            if not self.complete:
                return
            # Junk after a complete answer in the same read: the answer still stands (and its
            # last bytes must still reach the sink); the connection is closed, never reused.
        if self.sink is not None:
            if self.body or self.complete:
                pieces, self.body = self.body, []
                self.sink(pieces, self.complete)
        else:
            self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reader = self.reader
        if reader is not None:
            if exc is None and reader.end():  # the close ends a close-delimited body
                self._native_complete(False)
                events = self.events
                if events is not None:
                    events(reader.relay(b"", True, self.loop.time()))
            elif not reader.complete:
                self.fail(ConnectionBroken(self._closed_why(exc)))
            self._wake()
            return
        if self.head_done and not self.complete and not self._framed() and exc is None:
            # A close-delimited body ends with an orderly close; a reset (exc) breaks it.
            self.on_message_complete()
            if self.sink is not None:
                pieces, self.body = self.body, []
                self.sink(pieces, True)
        elif not self.complete:
            self.fail(ConnectionBroken(self._closed_why(exc)))
        self._wake()

    def _closed_why(self, exc: Exception | None) -> str:
        why = "the unit closed the connection" + (f": {exc}" if exc else "")
        fresh = self.idle_since == 0.0 and self.last_data == 0.0  # nothing ever came back
        if exc is None and fresh and self.tls:
            # How a server that rejects the client certificate answers under TLS 1.3: the
            # alert that says so reaches neither asyncio's nor uvloop's protocol.
            why += (
                " before answering on a new TLS connection: it may not accept the gateway's"
                " client certificate ([[units]] tls_cert and tls_key)"
            )
        return why

    # -- the native path --------------------------------------------------------------------

    def _native_head(self, data: bytes) -> None:
        """Gather the head, read it (the common shapes in C, any other with httptools, which
        also skips interim 1xx answers), then hand the rest to a native Reader framed as the
        head says."""
        buf = self._head + data if self._head else data
        native = self.native
        assert native is not None
        while True:
            end = head_end(buf)
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._broken(f"a response head longer than {MAX_HEAD} bytes")
                else:
                    self._head = buf
                return
            taken = native.response_head(buf, end)
            if taken is not None:
                self.status, self.headers, keep_alive = taken
                self.head_done = True
                buf = buf[end:]
                break
            parser = self.parser
            if parser is None:
                parser = self.parser = httptools.HttpResponseParser(self)
            try:
                parser.feed_data(buf[:end])
            except httptools.HttpParserError as exc:
                self._broken(str(exc))
                return
            buf = buf[end:]
            if self.head_done:
                keep_alive = parser.should_keep_alive()
                break
            self.parser = httptools.HttpResponseParser(self)  # after an interim answer
        self._head = b""
        self._head_keep_alive = keep_alive
        self.parser = None  # about 800 bytes an open stream need not hold
        self.reader = reader = native.Reader(*self._framing())
        self.body = reader.body  # the Reader appends to it until a relay attaches
        self.complete = False  # httptools may have said so of an empty body: the Reader says
        if buf:
            flags = reader.feed(buf, self.last_data)
        else:
            flags = native.COMPLETE if reader.complete else 0
        self._native_flags(flags)

    def _framing(self) -> tuple[int, int]:
        """The native Reader's (mode, length): chunked, a length, or until the close."""
        if b"chunked" in self.headers.get(b"transfer-encoding", b"").lower():
            return 0, 0
        length = self.headers.get(b"content-length")
        if length is not None:
            return 1, int(length)  # httptools has checked it is a number
        if self.status in (204, 304):
            return 1, 0
        return 2, 0

    def _native_flags(self, flags: int) -> None:
        native, reader = self.native, self.reader
        assert native is not None and reader is not None
        if flags & native.BROKEN:
            self._broken(str(reader.error))
            return
        if flags & native.COMPLETE:
            self._native_complete(not flags & native.JUNK)
        events = self.events
        if events is not None:
            events(flags)
        else:
            self._wake()
        if flags & native.JUNK:
            self.abort()  # the answer stands; the connection is never reused

    def _native_complete(self, keep: bool) -> None:
        self.complete = True
        self.keep_alive = keep and self._head_keep_alive

    def _broken(self, why: str) -> None:
        self.fail(ConnectionBroken(f"invalid HTTP from the unit: {why}"))
        self.abort()

    # -- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _HEADERS_READ:  # the others are not kept for the answer's whole life
            self.headers[name] = value

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # an interim answer (100 Continue, 103 Early Hints): skip it
            self.head_done = False
            self.headers = {}
            return
        self.complete = True
        # Asked here: httptools answers False once the message is done.
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()

    # -- used by the request task -----------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(head + body)

    async def wait_for(self, ready: Callable[[], bool]) -> None:
        """Sleep until `ready()` holds, re-checked after each read; raise if the answer failed."""
        while not self.ready(ready):
            await self.next_wake()

    def deadline(self, when: float) -> asyncio.TimerHandle:
        """At loop time `when`, fail the answer with a TimeoutError unless it is complete (the
        caller cancels the handle once it has what it waited for)."""
        return self.loop.call_at(when, self._late)

    def _late(self) -> None:
        self.fail(TimeoutError("no answer in time"))

    def ready(self, ready: Callable[[], bool]) -> bool:
        """`ready()`, or raise the answer's failure."""
        if self.error is not None:
            raise self.error
        return ready()

    def next_wake(self) -> asyncio.Future[None]:
        """A future the next read that matters (or a failure) completes. Awaited directly by a
        streaming relay, whose task then holds no coroutine frame of `wait_for`'s."""
        self._waiter = waiter = self.loop.create_future()
        return waiter

    def fail(self, error: BaseException) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self._wake()

    def wake(self) -> None:
        self._wake()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _framed(self) -> bool:
        return b"content-length" in self.headers or b"chunked" in self.headers.get(
            b"transfer-encoding", b""
        )
