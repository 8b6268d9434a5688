"""The two servers `loadtest.bench.front` compares: `python -m loadtest.bench.front_servers KIND
READY_FILE`, KIND `aiohttp` or `protocol`.

Both answer `POST /v1/chat/completions` the same way: they read the whole body, send a
streamed head and `EVENTS` as HTTP chunks, and end the body. `aiohttp` does it as the gateway's
public listener does: an Application, a route, a StreamResponse. `protocol` is a bare asyncio
Protocol on httptools' parser, with a prebuilt head and one task per request. Neither does
anything else, so the difference is what aiohttp's server machinery costs per request. Each
writes {"url", "pid"} to READY_FILE once it listens, and serves until it is stopped.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import cast

import httptools
import orjson
import uvloop
from aiohttp import web

PATH = "/v1/chat/completions"
EVENTS = [b'data: {"n": %d, "text": "tok"}\n\n' % i for i in range(3)]
HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nx-request-id: r1\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _streamed(request: web.Request) -> web.StreamResponse:
    await request.read()
    headers = {"Content-Type": "text/event-stream", "x-request-id": "r1"}
    response = web.StreamResponse(status=200, headers=headers)
    await response.prepare(request)
    for event in EVENTS:
        await response.write(event)
    await response.write_eof()
    return response


async def _serve_aiohttp() -> str:
    app = web.Application()
    app.router.add_post(PATH, _streamed)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return site.name


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed as they come, each answered by a task."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        for task in self.tasks:
            task.cancel()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body, self.headers = b"".join(self.body), [], {}
        task = asyncio.get_running_loop().create_task(self._answer(body))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, body: bytes) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(HEAD)
        for event in EVENTS:
            transport.write(_chunk(event))
        transport.write(LAST_CHUNK)


async def _serve_protocol() -> str:
    server = await asyncio.get_running_loop().create_server(_Connection, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    return f"http://{host}:{port}"


async def _main(kind: str, ready: Path) -> None:
    url = await (_serve_aiohttp() if kind == "aiohttp" else _serve_protocol())
    info = orjson.dumps({"url": url, "pid": os.getpid()})
    await asyncio.to_thread(ready.write_bytes, info)  # no request comes before it anyway
    await asyncio.Event().wait()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("aiohttp", "protocol"):
        raise SystemExit("usage: python -m loadtest.bench.front_servers aiohttp|protocol FILE")
    uvloop.run(_main(sys.argv[1], Path(sys.argv[2])))
