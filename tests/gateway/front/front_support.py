"""Gateways on either front in front of a recording unit, and a raw HTTP/1.1 client that reads
every answer on its connection: for the lean front's tests against real clients and hostile
heads (test_front_linger.py, test_front_hostile.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.config.proxy import FRONT_ENV
from gateway.paths import CHAT_PATH
from gateway.proxy.call import Call
from gateway.server import Gateway
from gateway.signals import Observer
from tests.gateway.servers import serve_app
from tests.support import MODEL, gateway_config


class Recorder:
    """A unit that answers every chat request with a small JSON completion and keeps the body
    of each, byte for byte, as it arrived."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(CHAT_PATH, self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


class Arrivals(Observer):
    """Counts the requests the gateway's request path received."""

    def __init__(self) -> None:
        self.count = 0

    def received(self, call: Call) -> None:
        self.count += 1


@contextlib.asynccontextmanager
async def gateway(
    monkeypatch: pytest.MonkeyPatch, front: str, unit: str, **sections: dict[str, Any]
) -> AsyncIterator[Gateway]:
    """A gateway on `front` ("lean" or "aiohttp") in front of the unit at `unit`."""
    config = gateway_config([{"id": "u0", "leader": unit, "nodes": [unit]}], **sections)
    with monkeypatch.context() as env:
        env.setenv(FRONT_ENV, front)
        gw = Gateway(config)
        await gw.start()
    try:
        assert gw.front == front
        yield gw
    finally:
        await gw.stop()


@contextlib.asynccontextmanager
async def recording_unit() -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder()
    async with serve_app(recorder.app()) as url:
        yield recorder, url


def chat_bytes(content: str) -> bytes:
    """A whole, valid, non-streamed chat request body."""
    return orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": False}
    )


async def _head(reader: asyncio.StreamReader, within: float) -> tuple[int, dict[str, str]] | None:
    """A response's status and headers, or None at EOF (or a reset) before one."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), within)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> None:
    if headers.get("transfer-encoding") == "chunked":
        while size := int(await asyncio.wait_for(reader.readline(), 5.0), 16):
            await asyncio.wait_for(reader.readexactly(size + 2), 5.0)
        await asyncio.wait_for(reader.readline(), 5.0)
        return
    await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 5.0)


async def transcript(
    port: int, data: bytes, quiet: float = 0.5
) -> list[tuple[int, dict[str, str]]]:
    """Send `data` on a new connection; the status and headers of every answer read back
    until the server closes, or is `quiet` seconds without starting another (the first may
    take 5 s). A 100 Continue counts as an answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers: list[tuple[int, dict[str, str]]] = []
    try:
        writer.write(data)
        while True:
            try:
                head = await _head(reader, quiet if answers else 5.0)
            except TimeoutError:
                return answers
            if head is None:
                return answers
            answers.append(head)
            if head[0] != 100:
                await _body(reader, head[1])
    finally:
        writer.close()
