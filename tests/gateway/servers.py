"""Real servers on 127.0.0.1 (ports from the OS) for the gateway's network components' tests:
an aiohttp app, a scripted raw TCP server (answers byte for byte, or never, or resets), and a
port where nothing listens. Waits poll a condition with a deadline, never sleep for luck."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable, Iterator

from aiohttp import web


async def until(ready: Callable[[], bool], within: float, what: str) -> float:
    """Poll `ready` until it holds (returns the loop time it did); fail after `within` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not ready():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {within} s")
        await asyncio.sleep(0.002)
    return loop.time()


@contextlib.asynccontextmanager
async def serve_app(
    app: web.Application, handler_cancellation: bool = True, keepalive_timeout: float = 75.0
) -> AsyncIterator[str]:
    """`app` on a real socket; yields its base URL."""
    runner = web.AppRunner(
        app,
        handler_cancellation=handler_cancellation,
        shutdown_timeout=0.5,
        keepalive_timeout=keepalive_timeout,
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


class Peer(asyncio.Protocol):
    """One accepted connection: keeps the request bytes and hands each whole request (head
    and Content-Length body) to the server's `answer`."""

    def __init__(self, answer: Callable[[Peer, bytes], None]) -> None:
        self.answer = answer
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, rest = self.buffer.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            request = head + b"\r\n\r\n" + rest[:length]
            self.buffer = rest[length:]
            self.requests.append(request)
            self.answer(self, request)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def reset(self) -> None:
        """Close with a TCP RST (linger 0), not an orderly FIN."""
        assert self.transport is not None
        sock = self.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


def never(peer: Peer, request: bytes) -> None:
    """Accept and read, never answer."""


class RawServer:
    """A TCP server on 127.0.0.1 whose every request gets `answer(peer, request)`."""

    def __init__(self, answer: Callable[[Peer, bytes], None] = never) -> None:
        self.answer = answer
        self.peers: list[Peer] = []
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def _peer(self) -> Peer:
        peer = Peer(self.answer)
        self.peers.append(peer)
        return peer

    async def __aenter__(self) -> RawServer:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._peer, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for peer in self.peers:
            if peer.transport is not None:
                peer.transport.abort()
        await asyncio.wait_for(self._server.wait_closed(), 5.0)


@contextlib.contextmanager
def refused_url() -> Iterator[str]:
    """A port bound but not listening (held, so nothing else takes it): connects are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def full_backlog_url() -> Iterator[str]:
    """A listener that never accepts, its accept queue filled: a connect gets no handshake."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        fillers: list[socket.socket] = []
        try:
            for _ in range(16):  # Linux queues backlog + 1; then SYNs are dropped
                filler = socket.socket()
                fillers.append(filler)
                filler.settimeout(0.1)
                try:
                    filler.connect(address)
                except TimeoutError:
                    break
            else:
                raise AssertionError("the accept queue never filled")
            yield f"http://127.0.0.1:{address[1]}"
        finally:
            for filler in fillers:
                filler.close()
