"""One HTTP exchange as the request path sees it: the request's headers and body, and the
answer, sent whole or as a stream of chunks.

Two fronts serve the proxy's routes. aiohttp's gives a `web.Request`, wrapped here in
`AioExchange`; the lean front (gateway/front) gives its own request, which has the same
methods. The handler, the intake and the relay use only these, so they serve either front.

A streamed answer's chunks are written straight to `transport` by the pump, already framed:
`open_stream` sends the head (chunked transfer coding), `write` frames gateway-made bytes,
`end_stream` sends the last chunk. Where the connection's bytes are all the front's own (the
lean front), the pump saves two writes a stream: the head waits for the first bytes
(`take_head`), and a clean end's last chunk goes with the last bytes (`can_end_in_place`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from aiohttp import StreamReader, web
from aiohttp.abc import AbstractStreamWriter

from gateway.errors import InvalidRequest

BODY_READ = 64 * 1024  # bytes asked of aiohttp's payload stream at a time

# What the handler returns once a streamed answer went out on an exchange that is not
# aiohttp's: that front has already written everything.
STREAMED = web.StreamResponse()


class Exchange(Protocol):
    @property
    def headers(self) -> Mapping[str, str]:
        """The request's headers (names are case-insensitive)."""
        ...

    @property
    def transport(self) -> asyncio.Transport | None:
        """The client's connection (None once it is gone)."""
        ...

    def hold(self) -> None:
        """The request is in progress: no keep-alive timer need run for its connection."""
        ...

    async def body(self, limit: int, within: float) -> bytes:
        """The whole body; InvalidRequest past `limit` bytes (413), if it does not arrive
        `within` seconds (408) or cannot be read (400)."""
        ...

    async def open_stream(self, status: int, headers: Mapping[str, str]) -> bool:
        """Send a streamed answer's head, or keep it for `take_head`; False if the client is
        already gone."""
        ...

    def take_head(self) -> bytes:
        """The head `open_stream` kept, which the caller now sends ahead of the first bytes
        (b"" when it went out already)."""
        ...

    @property
    def can_end_in_place(self) -> bool:
        """Whether the pump may write the last chunk itself, with the answer's last bytes;
        it then says so with `ended_in_place` instead of calling `end_stream`."""
        ...

    def ended_in_place(self) -> None:
        """The pump wrote the stream's last chunk."""
        ...

    async def write(self, data: bytes) -> None:
        """Send `data` as one chunk (ConnectionError if the client is gone)."""
        ...

    async def drain(self) -> None:
        """Wait until the client's send buffer has room again."""
        ...

    async def end_stream(self) -> None:
        """Send the stream's last chunk (ConnectionError if the client is gone)."""
        ...

    def streamed(self) -> web.StreamResponse:
        """What the handler returns for a stream it sent on this exchange."""
        ...


def too_large(limit: int) -> InvalidRequest:
    return InvalidRequest(f"request body exceeds {limit} bytes", status=413, code="body_too_large")


def body_late(timeout: float) -> InvalidRequest:
    return InvalidRequest(
        f"request body not received within {timeout:g} s", status=408, code="body_timeout"
    )


class AioExchange:
    """An exchange on aiohttp's front."""

    __slots__ = ("_writer", "request", "response")

    def __init__(self, request: web.BaseRequest) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self._writer: AbstractStreamWriter | None = None

    @property
    def headers(self) -> Mapping[str, str]:
        return self.request.headers

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.request.transport

    def hold(self) -> None:
        # aiohttp arms a keep-alive timer when the connection opens; while a request is in
        # progress its firing does nothing, and the request's end arms it again. `keep_alive`
        # cancels it (0.5 KB a request, for its whole life); the flag it sets is overwritten
        # from the response when the request ends.
        self.request.protocol.keep_alive(True)

    async def body(self, limit: int, within: float) -> bytes:
        """Read from the payload stream rather than with `request.read()`, which also keeps a
        copy on the request (and grows its attributes) for the stream's whole life."""
        length = self.request.content_length
        content = self.request.content
        try:
            if length is not None and length > limit:
                raise too_large(limit)
            if content.is_eof():  # all of it came with the head (most requests): no wait
                body = content.read_nowait()
                if len(body) > limit:
                    raise too_large(limit)
                return body
            async with asyncio.timeout(within):
                return await _read_at_most(content, limit)
        except TimeoutError:
            raise body_late(within) from None
        except web.RequestPayloadError as exc:  # undecodable gzip/deflate/br, broken chunks
            detail = getattr(exc.__cause__, "message", None) or str(exc)
            raise InvalidRequest(f"request body could not be read: {detail}") from None

    async def open_stream(self, status: int, headers: Mapping[str, str]) -> bool:
        out = web.StreamResponse(status=status, headers=headers)
        self.response = out
        try:
            self._writer = await out.prepare(self.request)
        except ConnectionError:
            return False
        transport = self.request.transport
        return transport is not None and not transport.is_closing()

    def take_head(self) -> bytes:
        return b""  # aiohttp's writer sent it

    @property
    def can_end_in_place(self) -> bool:
        return False  # the response's writer must see its own end (write_eof)

    def ended_in_place(self) -> None:
        raise AssertionError("aiohttp's front ends its streams with write_eof")

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        await self.response.write(data)

    async def drain(self) -> None:
        assert self._writer is not None
        await self._writer.drain()

    async def end_stream(self) -> None:
        assert self.response is not None
        await self.response.write_eof()

    def streamed(self) -> web.StreamResponse:
        assert self.response is not None
        return self.response


async def _read_at_most(content: StreamReader, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := await content.read(BODY_READ):
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
