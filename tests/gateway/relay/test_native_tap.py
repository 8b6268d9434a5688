"""The native relay's Tap: the protocol the pool connects with, on real sockets. The event loop
hands it every read; the connection's Python `data_received` runs for the response head only,
and the answer's body goes from the loop to the compiled Reader directly."""

from __future__ import annotations

import asyncio

import pytest

from gateway.relay.native import module
from gateway.upstream.connection import UpstreamConnection, connection_of, tapped
from gateway.upstream.pool import ConnectionPool, Endpoint
from tests.gateway.servers import Peer, RawServer, until

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def test_the_body_reaches_the_reader_without_the_connections_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    native = module()
    seen: list[bytes] = []
    own = UpstreamConnection.data_received

    def counted(self: UpstreamConnection, data: bytes) -> None:
        seen.append(data)
        own(self, data)

    monkeypatch.setattr(UpstreamConnection, "data_received", counted)
    peers: list[Peer] = []
    async with RawServer(lambda peer, _: peers.append(peer)) as server:
        pool = ConnectionPool(5.0, 30.0, 0, native=native)
        conn = await pool.acquire(Endpoint(server.url))
        assert conn.transport is not None
        tap = conn.transport.get_protocol()
        assert isinstance(tap, native.Tap) and tap.conn is conn
        conn.send(REQUEST, b"")
        await until(lambda: bool(peers), 5.0, "the request")
        peers[0].write(HEAD + chunk(b"data: 1\n\n"))
        await until(lambda: conn.reader is not None, 5.0, "the head")
        assert b"".join(conn.reader.body) == b"data: 1\n\n"
        heads = len(seen)
        assert heads >= 1
        head_at = conn.last_data
        for n in range(2, 5):  # each its own read: written once the last one was read
            peers[0].write(chunk(b"data: %d\n\n" % n))
            await until(lambda n=n: len(conn.reader.body) == n, 5.0, f"body read {n}")
        peers[0].write(b"0\r\n\r\n")
        await until(lambda: conn.complete, 5.0, "the end of the answer")
        assert len(seen) == heads  # the body's reads never ran the Python data_received
        assert conn.reader.heard > head_at  # the Reader keeps the time of the last read
        assert conn.reusable()
        pool.release(Endpoint(server.url), conn)
        pool.close()


async def test_the_python_relay_connects_with_the_connection_itself() -> None:
    async with RawServer() as server:
        pool = ConnectionPool(5.0, 30.0, 0, native=None)
        conn = await pool.acquire(Endpoint(server.url))
        assert conn.transport is not None and conn.transport.get_protocol() is conn
        conn.abort()
        pool.close()


async def test_the_tap_forwards_every_other_protocol_call() -> None:
    native = module()
    loop = asyncio.get_running_loop()
    conn = UpstreamConnection(loop, native)
    tap = tapped(conn)
    assert connection_of(tap) is conn and connection_of(conn) is conn
    assert tapped(UpstreamConnection(loop, None)).native is None  # no Tap: itself
    tap.pause_writing()
    tap.resume_writing()
    assert tap.eof_received() is None  # the connection's answer: close the transport
    tap.connection_lost(None)
    assert conn.closed and isinstance(conn.error, ConnectionError)


def test_a_tap_without_its_connection_says_so() -> None:
    native = module()
    bare = native.Tap.__new__(native.Tap)
    with pytest.raises(RuntimeError, match="not initialised"):
        bare.data_received(b"x")
    with pytest.raises(AttributeError):
        native.Tap(object())  # not a connection: it has no loop


class _PlainConnection:
    """A connection whose `reader` and `events` are ordinary attributes, not __slots__: the
    Tap reads them by name (it reads a slotted connection's at their offsets)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.reader: object = None
        self.events: object = None
        self.heads: list[bytes] = []
        self.flags: list[int] = []

    def data_received(self, data: bytes) -> None:
        self.heads.append(data)

    def _native_flags(self, flags: int) -> None:
        self.flags.append(flags)


async def test_a_connection_without_slots_is_read_by_attribute() -> None:
    native = module()
    conn = _PlainConnection(asyncio.get_running_loop())
    tap = native.Tap(conn)
    tap.data_received(b"head")  # no Reader yet: the connection's Python
    assert conn.heads == [b"head"]
    conn.reader = native.Reader(0)  # chunked
    tap.data_received(chunk(b"data: 1\n\n"))
    assert b"".join(conn.reader.body) == b"data: 1\n\n"  # type: ignore[attr-defined]
    assert conn.flags == [0]  # no relay attached (events None): told, as the Python path does
    conn.events = object()
    tap.data_received(chunk(b"data: 2\n\n"))
    assert conn.flags == [0]  # an ordinary read with a relay attached needs no Python
    tap.data_received(b"0\r\n\r\n")
    assert conn.flags == [0, native.COMPLETE]


async def test_an_unset_slot_raises_as_its_attribute_would() -> None:
    native = module()
    conn = UpstreamConnection(asyncio.get_running_loop(), native)
    tap = tapped(conn)
    del conn.reader
    with pytest.raises(AttributeError, match="reader"):
        tap.data_received(b"x")
