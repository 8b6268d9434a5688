"""The lean front on real sockets: which requests it serves itself, and that everything else
reaches aiohttp intact (on the same connection), answered exactly as aiohttp answers it."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.config import config_from_dict
from gateway.config.proxy import FRONT_ENV
from gateway.errors import InvalidRequest
from gateway.front.head import MAX_FIELDS, MAX_HEAD, MAX_LINE
from gateway.front.linger import LingerLimits
from gateway.front.protocol import LeanRoute
from gateway.front.request import LeanRequest
from gateway.front.server import Front
from gateway.server import running
from tests.support import MODEL, SimProcess, chat_body, gateway_config, sse_events

LIMIT = 1 << 20


async def _echo(request: LeanRequest) -> web.StreamResponse:
    body = await request.body(LIMIT, 2.0)
    return web.Response(body=b"lean:" + body, content_type="text/plain")


async def _small(request: LeanRequest) -> web.StreamResponse:
    try:
        body = await request.body(16, 2.0)
    except InvalidRequest as exc:  # past 16 bytes: 413
        return exc.response()
    return web.Response(body=body)


async def _stream(request: LeanRequest) -> web.StreamResponse:
    await request.body(LIMIT, 2.0)
    assert await request.open_stream(200, {"Content-Type": "text/event-stream", "x-u": "u0"})
    await request.write(b"data: 1\n\n")
    await request.write(b"data: 2\n\n")
    await request.end_stream()
    return request.streamed()


async def _boom(request: LeanRequest) -> web.StreamResponse:
    raise RuntimeError("a bug")


class Held:
    """A route that holds its request until released; says when it was cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, request: LeanRequest) -> web.StreamResponse:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return web.Response(body=b"released")


async def _aio(request: web.Request) -> web.Response:
    return web.Response(body=b"aio:" + await request.read(), content_type="text/plain")


@contextlib.asynccontextmanager
async def serving(
    routes: dict[str, LeanRoute] | None = None,
    keepalive: float = 5.0,
    cors: bool = False,
    linger: LingerLimits | None = None,
) -> AsyncIterator[tuple[int, Front]]:
    app = web.Application()
    app.router.add_post("/lean", _aio)
    app.router.add_get("/aio", _aio)
    runner = web.AppRunner(app, handler_cancellation=True, keepalive_timeout=keepalive)
    await runner.setup()
    assert runner.server is not None
    base: dict[str, LeanRoute] = {"/lean": _echo, "/stream": _stream, "/boom": _boom}
    routes = {**base, **(routes or {})}
    limits = linger or LingerLimits()
    front = Front(routes, runner.server, keepalive=keepalive, cors=cors, linger=limits)
    server = await asyncio.get_running_loop().create_server(front, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], front
    finally:
        server.close()
        await front.shutdown(1.0)
        await runner.cleanup()


def post(path: str, body: bytes = b"", *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        """One response: status, headers (lower-cased names), body (de-chunked)."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5.0)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        if status == 100:
            return status, headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(await asyncio.wait_for(self.reader.readline(), 5.0), 16)
                data = await asyncio.wait_for(self.reader.readexactly(size + 2), 5.0)
                if size == 0:
                    return status, headers, body
                body += data[:-2]
        length = int(headers.get("content-length", "0"))
        return status, headers, await asyncio.wait_for(self.reader.readexactly(length), 5.0)

    async def closed(self) -> bool:
        """Whether the server closed the connection (within 5 s)."""
        return await asyncio.wait_for(self.reader.read(), 5.0) == b""


@contextlib.asynccontextmanager
async def connect(port: int) -> AsyncIterator[Client]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield Client(reader, writer)
    finally:
        writer.close()


async def test_a_post_to_a_lean_route_is_served_by_the_lean_front() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(post("/lean", b"hello"))
        status, headers, body = await c.answer()
        assert (status, body) == (200, b"lean:hello")
        assert headers["content-type"] == "text/plain"
        assert headers["content-length"] == "10" and "date" in headers and "server" in headers
        assert "connection" not in headers  # kept alive


async def test_a_streamed_answer_is_chunked_and_the_connection_kept_alive() -> None:
    async with serving() as (port, _), connect(port) as c:
        for _ in range(2):
            c.writer.write(post("/stream", b"{}"))
            status, headers, body = await c.answer()
            assert (status, body) == (200, b"data: 1\n\ndata: 2\n\n")
            assert headers["content-type"] == "text/event-stream" and headers["x-u"] == "u0"


async def test_other_requests_on_the_same_connection_go_to_aiohttp() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(post("/lean", b"a"))
        assert (await c.answer())[2] == b"lean:a"
        c.writer.write(b"GET /aio HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await c.answer())[2] == b"aio:"
        c.writer.write(post("/lean", b"b"))  # the connection is aiohttp's from then on
        assert (await c.answer())[2] == b"aio:b"


@pytest.mark.parametrize(
    ("request_bytes", "why"),
    [
        (post("/lean", gzip.compress(b"zipped"), "Content-Encoding: gzip"), "a coded body"),
        (
            b"POST /lean HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"6\r\nzipped\r\n0\r\n\r\n",
            "a chunked body",
        ),
        (b"POST /lean HTTP/1.0\r\nHost: x\r\nContent-Length: 6\r\n\r\nzipped", "HTTP/1.0"),
    ],
)
async def test_what_the_lean_front_does_not_take_aiohttp_reads_whole(
    request_bytes: bytes, why: str
) -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(request_bytes)
        status, _, body = await c.answer()
        assert (status, body) == (200, b"aio:zipped"), why


async def test_an_expectation_it_does_not_know_gets_aiohttps_417() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(post("/lean", b"x", "Expect: 200-ok"))
        assert (await c.answer())[0] == 417


async def test_a_request_with_no_length_goes_to_aiohttp() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(b"POST /lean HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await c.answer())[2] == b"aio:"


async def test_an_origin_goes_to_aiohttp_when_cors_is_on() -> None:
    async with serving(cors=True) as (port, _), connect(port) as c:
        c.writer.write(post("/lean", b"o", "Origin: https://app.example"))
        assert (await c.answer())[2] == b"aio:o"
    async with serving(cors=False) as (port, _), connect(port) as c:
        c.writer.write(post("/lean", b"o", "Origin: https://app.example"))
        assert (await c.answer())[2] == b"lean:o"


@pytest.mark.parametrize(
    "head",
    [
        b"POST /lean HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"POST /lean HTTP/1.1\r\nHost: x\r\nContent-Length: 6\n\nzipped",  # bare LF
        b"POST /lean HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n",  # folded
    ],
)
async def test_a_malformed_head_gets_aiohttps_own_answer(head: bytes) -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(head)
        status, _, body = await c.answer()
        assert status == 400 and b"aio:" not in body and b"lean:" not in body
        assert await c.closed()


@pytest.mark.parametrize(
    "head",
    [
        post("/lean", b"", "X-Long: " + "a" * (MAX_LINE + 1)),
        post("/lean?" + "q" * MAX_LINE, b""),
        post("/lean", b"", *(f"X-{i}: {i}" for i in range(MAX_FIELDS))),
    ],
)
async def test_a_head_past_aiohttps_limits_gets_its_answer(head: bytes) -> None:
    """Within the lean front's own 16 KiB but past a limit aiohttp sets on a line or on the
    count of fields: aiohttp's 400, as without the lean front."""
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(head)
        status, _, _ = await c.answer()
        assert status == 400  # the lean front would have answered 200


async def test_a_head_past_the_limit_gets_aiohttps_own_answer() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(b"POST /lean HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD + 10))
        status, _, _ = await c.answer()
        assert status in (400, 431)


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(post("/lean", b"1") + post("/stream") + post("/lean", b"3"))
        assert (await c.answer())[2] == b"lean:1"
        assert (await c.answer())[2] == b"data: 1\n\ndata: 2\n\n"
        assert (await c.answer())[2] == b"lean:3"


async def test_a_pipelined_request_aiohttp_takes_gets_its_bytes() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(post("/lean", b"1") + b"GET /aio HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await c.answer())[2] == b"lean:1"
        assert (await c.answer())[2] == b"aio:"


async def test_a_body_in_pieces_and_100_continue() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(
            post("/lean", b"", "Expect: 100-continue").replace(b"Length: 0", b"Length: 6")
        )
        status, _, _ = await c.answer()
        assert status == 100
        c.writer.write(b"abc")
        await asyncio.sleep(0.05)
        c.writer.write(b"def")
        assert (await c.answer())[:3:2] == (200, b"lean:abcdef")


async def test_a_body_too_large_is_refused_and_the_connection_closed() -> None:
    async with serving({"/small": _small}) as (port, _), connect(port) as c:
        c.writer.write(post("/small", b"").replace(b"Length: 0", b"Length: 100") + b"x" * 10)
        status, headers, _ = await c.answer()
        # Refused on its length; the rest of its body must not be read as the next request.
        assert (status, headers["connection"]) == (413, "close")
        assert await c.closed()


async def test_a_failing_handler_answers_500() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(post("/boom"))
        status, _, body = await c.answer()
        assert status == 500 and b"Internal Server Error" in body
        c.writer.write(post("/lean", b"after"))  # the connection still serves
        assert (await c.answer())[2] == b"lean:after"


async def _opened_then_boom(request: LeanRequest) -> web.StreamResponse:
    assert await request.open_stream(200, {"Content-Type": "text/event-stream"})
    raise RuntimeError("a bug before the first bytes")


async def test_a_handler_that_fails_before_its_stream_sent_anything_answers_500() -> None:
    """A streamed answer's head waits for its first bytes: if none ever went, a 500 still can
    (and the connection closes, as after any opened stream)."""
    async with serving({"/half": _opened_then_boom}) as (port, _), connect(port) as c:
        c.writer.write(post("/half"))
        status, headers, body = await c.answer()
        assert status == 500 and b"Internal Server Error" in body
        assert headers["connection"] == "close"
        assert await c.closed()


async def test_connection_close_is_honoured() -> None:
    async with serving() as (port, _), connect(port) as c:
        c.writer.write(post("/lean", b"x", "Connection: close"))
        _, headers, _ = await c.answer()
        assert headers["connection"] == "close"
        assert await c.closed()


async def test_an_idle_connection_is_closed_after_the_keepalive_timeout() -> None:
    async with serving(keepalive=0.3) as (port, _), connect(port) as c:
        c.writer.write(post("/lean", b"x"))
        await c.answer()
        idle_from = time.monotonic()
        assert await c.closed()
        assert time.monotonic() - idle_from >= 0.25


async def test_the_keepalive_timeout_counts_from_the_last_answer_not_the_first() -> None:
    # The timer armed when the connection came fires mid-way: a request answered since then
    # started the quiet again, so the connection stays open until a whole quiet has passed.
    async with serving(keepalive=0.4) as (port, _), connect(port) as c:
        await asyncio.sleep(0.25)
        c.writer.write(post("/lean", b"x"))
        assert (await c.answer())[0] == 200
        idle_from = time.monotonic()
        await asyncio.sleep(0.25)  # the first timer (0.4 s after the connection) fired
        c.writer.write(post("/lean", b"y"))
        assert (await c.answer())[2] == b"lean:y"
        idle_from = time.monotonic()
        assert await c.closed()
        assert time.monotonic() - idle_from >= 0.35


async def test_a_request_longer_than_the_keepalive_timeout_keeps_its_connection() -> None:
    held = Held()
    async with serving({"/held": held}, keepalive=0.2) as (port, _), connect(port) as c:
        c.writer.write(post("/held"))
        await asyncio.wait_for(held.started.wait(), 5.0)
        await asyncio.sleep(0.5)  # the keep-alive timer fired while the request ran
        held.release.set()
        assert (await c.answer())[2] == b"released"
        c.writer.write(post("/lean", b"after"))  # still open, and closed after its own quiet
        assert (await c.answer())[2] == b"lean:after"
        idle_from = time.monotonic()
        assert await c.closed()
        assert time.monotonic() - idle_from >= 0.15


async def test_a_client_that_leaves_cancels_its_request() -> None:
    held = Held()
    async with serving({"/held": held}) as (port, front):
        async with connect(port) as c:
            c.writer.write(post("/held"))
            await asyncio.wait_for(held.started.wait(), 5.0)
        await asyncio.wait_for(held.cancelled.wait(), 5.0)
        deadline = time.monotonic() + 5.0
        while front.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not front.connections


async def test_shutdown_lets_requests_in_flight_end_and_closes_idle_connections() -> None:
    held = Held()
    async with (
        serving({"/held": held}) as (port, front),
        connect(port) as busy,
        connect(port) as idle,
    ):
        idle.writer.write(post("/lean", b"x"))
        await idle.answer()
        busy.writer.write(post("/held"))
        await asyncio.wait_for(held.started.wait(), 5.0)
        shutdown = asyncio.create_task(front.shutdown(5.0))
        assert await idle.closed()
        assert not shutdown.done()
        held.release.set()
        await asyncio.wait_for(shutdown, 5.0)
        status, headers, body = await busy.answer()
        assert (status, body, headers["connection"]) == (200, b"released", "close")


async def test_shutdown_cancels_what_outlasts_its_grace() -> None:
    held = Held()
    async with serving({"/held": held}) as (port, front), connect(port) as c:
        c.writer.write(post("/held"))
        await asyncio.wait_for(held.started.wait(), 5.0)
        await asyncio.wait_for(front.shutdown(0.1), 5.0)
        assert held.cancelled.is_set()
        assert await c.closed()


@pytest.mark.parametrize("front", ["lean", "aiohttp"])
async def test_the_gateway_answers_the_same_on_either_front(
    clean_sim: SimProcess, monkeypatch: pytest.MonkeyPatch, front: str
) -> None:
    monkeypatch.setenv(FRONT_ENV, front)
    config = gateway_config(clean_sim.units[:1])
    async with running(config) as gw, aiohttp.ClientSession() as http:
        assert gw.front == front
        chat = gw.public_url + "/v1/chat/completions"
        async with http.post(chat, json=chat_body(max_tokens=3)) as resp:
            assert resp.status == 200 and resp.headers["x-unitgate-unit"] == "u0"
            assert resp.headers["Content-Type"] == "text/event-stream"
            events = await sse_events(resp)
        assert events[-1] == "[DONE]" and len(events) >= 4
        async with http.post(chat, json=chat_body(stream=False, max_tokens=2)) as resp:
            assert resp.status == 200 and resp.content_type == "application/json"
            assert (await resp.json())["usage"]["completion_tokens"] == 2
        async with http.post(chat, json={"model": MODEL, "messages": "no"}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["type"]
        async with http.get(gw.public_url + "/v1/models") as resp:  # aiohttp's either way
            assert resp.status == 200


def test_unitgate_front_overrides_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FRONT_ENV, raising=False)  # `make test` sets it
    config = config_from_dict({"gateway": {"front": "aiohttp"}})
    assert config.gateway.front_chosen == "aiohttp"
    monkeypatch.setenv(FRONT_ENV, "lean")
    assert config.gateway.front_chosen == "lean"
    monkeypatch.setenv(FRONT_ENV, "h2o")
    with pytest.raises(ValueError, match="UNITGATE_FRONT = 'h2o': must be one of lean, aiohttp"):
        config.gateway.front_chosen  # noqa: B018


async def test_a_client_that_does_not_read_holds_the_writer_back() -> None:
    """Writes wait for the client to drain: what is buffered for it stays bounded."""
    written = [0]
    chunk, total = b"x" * 65536, 512  # 32 MiB: more than the kernel's buffers hold

    async def flood(request: LeanRequest) -> web.StreamResponse:
        await request.open_stream(200, {"Content-Type": "application/octet-stream"})
        for _ in range(total):
            await request.write(chunk)
            written[0] += 1
        await request.end_stream()
        return request.streamed()

    async with serving({"/flood": flood}) as (port, _), connect(port) as c:
        c.writer.write(post("/flood"))
        await asyncio.sleep(0.5)  # not reading
        held = written[0]
        assert 0 < held < total
        await asyncio.sleep(0.2)
        assert written[0] == held  # still waiting for the client
        status, _, body = await c.answer()  # reading it all lets it finish
        assert status == 200 and len(body) == total * len(chunk)
        assert written[0] == total
