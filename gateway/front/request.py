"""One request on the lean front, as the request path's Exchange (gateway/proxy/exchange.py):
its head and body, and its answer written straight to the connection."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from aiohttp import web

from gateway.base.net import LAST_CHUNK
from gateway.front.head import Head
from gateway.front.reply import CONTINUE, chunk, stream_head
from gateway.proxy.exchange import STREAMED, body_late, too_large


class Connection(Protocol):
    """The request's connection (protocol.py's FrontProtocol)."""

    @property
    def transport(self) -> asyncio.Transport | None: ...

    async def drained(self) -> None:
        """Until the client's send buffer has room again."""
        ...


class LeanRequest:
    __slots__ = (
        "_chunks",
        "_head",
        "_waiter",
        "continued",
        "ended",
        "head",
        "head_sent",
        "headers",
        "proto",
        "received",
        "refused",
    )

    def __init__(self, proto: Connection, head: Head) -> None:
        self.proto, self.head = proto, head
        self.headers: Mapping[str, str] = head.headers  # an attribute: read often, no call
        self.received = 0  # body bytes so far
        self._chunks: list[bytes] = []
        self._waiter: asyncio.Future[None] | None = None  # the body's, while it is awaited
        self.continued = False  # `100 Continue` sent
        self.head_sent = False  # a streamed answer's head went out (or is kept in `_head`)
        self._head = b""  # that head, while it waits to go with the first bytes
        self.ended = False  # and its last chunk
        self.refused = False  # its body too large: what still comes of it is not kept

    # -- fed by the protocol --------------------------------------------------------------

    @property
    def missing(self) -> int:
        return self.head.length - self.received

    def feed(self, data: bytes) -> None:
        """Body bytes (never more than `missing`)."""
        if not self.refused:
            self._chunks.append(data)
        self.received += len(data)
        waiter = self._waiter
        if waiter is not None and self.received == self.head.length and not waiter.done():
            waiter.set_result(None)

    def lost(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client closed the connection"))

    @property
    def keep_alive(self) -> bool:
        """Whether the connection can take the next request once this one is answered."""
        return self.head.keep_alive and self.missing == 0 and (self.ended or not self.head_sent)

    # -- the Exchange ---------------------------------------------------------------------

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.proto.transport

    def hold(self) -> None:
        pass  # the front's keep-alive timer runs only between requests

    async def body(self, limit: int, within: float) -> bytes:
        if self.head.length > limit:
            self.refused = True
            self._chunks.clear()
            raise too_large(limit)
        if self.missing:
            transport = self.proto.transport
            if self.head.expect_continue and not self.continued and transport is not None:
                self.continued = True
                transport.write(CONTINUE)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(within):
                    await self._waiter
            except TimeoutError:
                raise body_late(within) from None
            finally:
                self._waiter = None
        chunks, self._chunks = self._chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _live(self) -> asyncio.Transport:
        """The client's transport; ConnectionResetError once it is gone."""
        transport = self.proto.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        return transport

    async def open_stream(self, status: int, headers: Mapping[str, str]) -> bool:
        try:
            self._live()
        except ConnectionResetError:
            return False
        self.head_sent = True
        self._head = stream_head(status, headers.items(), self.head.keep_alive)
        return True

    def take_head(self) -> bytes:
        head, self._head = self._head, b""
        return head

    @property
    def can_end_in_place(self) -> bool:
        return True

    def ended_in_place(self) -> None:
        self.ended = True

    async def write(self, data: bytes) -> None:
        self._live().write(self.take_head() + chunk(data))
        await self.proto.drained()

    async def drain(self) -> None:
        await self.proto.drained()

    async def end_stream(self) -> None:
        self._live().write(self.take_head() + LAST_CHUNK)
        self.ended = True

    def streamed(self) -> web.StreamResponse:
        return STREAMED
