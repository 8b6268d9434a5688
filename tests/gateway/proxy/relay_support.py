"""The relay tests' harness: a raw unit's scripted answer (SSE head, HTTP chunks), an aiohttp
server whose handler relays it through a StreamRelay as the stream phase does (Relayed, with the
gaps it records), the client's side of it, and chat events as a tracked (resumable) stream's
engine sends them. The `upstream` fixture these take is in tests/gateway/conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.observability.histogram import Histogram
from gateway.outcomes import End
from gateway.proxy.exchange import AioExchange
from gateway.proxy.relay import StreamRelay
from gateway.proxy.upstream import Answer, UpstreamClient
from gateway.relay.tracker import StreamTracker
from tests.gateway.servers import Peer, serve_app

PATH = "/v1/chat/completions"
FIRST = b'data: {"n": 1}\n\n'
DONE = b"data: [DONE]\n\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def starts_with(first: bytes) -> Callable[[Peer, bytes], None]:
    """A unit that answers with the SSE head and `first`; the test scripts the rest."""
    return lambda peer, _: peer.write(SSE_HEAD + chunk(first))


class Gaps(Histogram):
    """The gaps' histogram the gateway keeps per unit, read by the tests (both relays fill
    it: the Python one by observations, the native one by merged bucket counts)."""


class Relayed:
    """A server whose handler relays the unit's answer as the stream phase does: start, pump,
    then finish (complete), nothing (client gone) or fail (anything else)."""

    def __init__(
        self,
        upstream: UpstreamClient,
        unit_url: str,
        *,
        idle: float = 5.0,
        within: float = 5.0,
        tracker: StreamTracker | None = None,
        quiet: tuple[float, float] = (0.2, 4.0),
        detail: str | None = None,
    ) -> None:
        self.upstream, self.unit_url = upstream, unit_url
        self.idle, self.within, self.tracker, self.quiet = idle, within, tracker, quiet
        self.detail = detail
        self.app = web.Application()
        self.app.router.add_post(PATH, self.handle)
        self.gaps = Gaps()
        self.ended: asyncio.Future[End] = asyncio.get_running_loop().create_future()
        self.before_pump: Callable[[Answer], Awaitable[None]] | None = None
        self.relay: StreamRelay | None = None
        self.answer: Answer | None = None
        self.client: asyncio.Transport | None = None  # the client's connection, server side
        self.unit_closed = False  # whether the pump itself closed the unit's connection

    async def handle(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        answer = await self.upstream.open("u0", self.unit_url, PATH, b"{}", "r1", loop.time() + 2)
        self.answer, self.client = answer, request.transport
        exchange = AioExchange(request)
        relay = StreamRelay(
            exchange,
            {"x-unitgate-unit": "u0"},
            loop.time() + self.within,
            self.idle,
            self.upstream.timers,
            self.tracker,
            self.quiet,
        )
        self.relay = relay
        try:
            assert await relay.start(answer)
            if self.before_pump is not None:
                await self.before_pump(answer)
            end = await relay.pump(answer, self.gaps)
            self.unit_closed = answer.connection is not None and answer.connection.closed
            self.ended.set_result(end)
            if end is End.COMPLETE:
                await relay.finish()
            elif end is not End.CLIENT_GONE:
                await relay.fail(end, self.detail)
        except BaseException as exc:
            if not self.ended.done():
                self.ended.set_exception(exc)
            raise
        finally:
            self.upstream.finish(answer)
        return exchange.streamed()

    async def end(self, within: float = 3.0) -> End:
        return await asyncio.wait_for(asyncio.shield(self.ended), within)


@contextlib.asynccontextmanager
async def stream_of(
    relayed: Relayed, handler_cancellation: bool = True, **session: Any
) -> AsyncIterator[aiohttp.ClientResponse]:
    """The client's response to a request the relay serves (its head is in)."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        serve_app(relayed.app, handler_cancellation) as url,
        aiohttp.ClientSession(timeout=timeout, **session) as http,
        http.post(url + PATH, data=b"{}") as resp,
    ):
        yield resp


async def next_chunk(resp: aiohttp.ClientResponse) -> bytes:
    """The next HTTP chunk the client receives, whole."""
    data, end_of_chunk = await asyncio.wait_for(resp.content.readchunk(), 2.0)
    assert end_of_chunk, data
    return data


def events(body: bytes) -> list[bytes]:
    """The SSE events (blank-line terminated) of `body`, each without its terminator."""
    assert body.endswith(b"\n\n"), body
    return body[:-2].split(b"\n\n")


def error_event(event: bytes) -> dict[str, Any]:
    assert event.startswith(b"data: "), event
    error: dict[str, Any] = orjson.loads(event[6:])["error"]
    return error


def tracked() -> StreamTracker:
    return StreamTracker(chat=True, client_ids=False, include_usage=False)


def chat_event(content: str | None, ids: list[int], finish: str | None = None) -> bytes:
    """A chat chunk as an engine sends it when asked for token ids (the builtin's key order)."""
    delta = {"role": "assistant", "content": ""} if content is None else {"content": content}
    chunk_: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "created": 1}
    chunk_["model"] = "m"
    if content is None:
        chunk_["prompt_token_ids"] = [1, 2, 3]
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    chunk_["choices"] = [{**choice, "token_ids": ids}]
    return b"data: " + orjson.dumps(chunk_) + b"\n\n"


OPENING = chat_event(None, [])
