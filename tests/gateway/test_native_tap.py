"""The native relay's Tap: the protocol the pool connects with, on real sockets. The event loop
hands it every read; the connection's Python `data_received` runs for the response head only,
and the answer's body goes from the loop to the compiled Reader directly."""

from __future__ import annotations

import asyncio

import pytest

from gateway.native import module
from gateway.proxy.connection import UpstreamConnection, connection_of, tapped
from gateway.proxy.pool import ConnectionPool, Endpoint
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
