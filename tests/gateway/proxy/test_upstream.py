"""The upstream client and its raw connections, built on their own against real servers on
127.0.0.1: what `open()` returns (first bytes of a stream, a whole plain body), how each
failure before the first byte is classified, what goes upstream, and which connections
`finish()` and the pool keep for the next request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

from gateway.config import config_from_dict
from gateway.errors import UpstreamError
from gateway.outcomes import Failure
from gateway.proxy.upstream import Answer, UpstreamClient
from tests.gateway.servers import (
    Peer,
    RawServer,
    full_backlog_url,
    never,
    refused_url,
    serve_app,
    until,
)

pytestmark = pytest.mark.both_relays

PATH = "/v1/chat/completions"
BODY = orjson.dumps({"model": "m", "messages": [], "stream": True})
FIRST = b'data: {"n": 1}\n\n'
REST = b'data: {"n": 2}\n\ndata: [DONE]\n\n'
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)

Make = Callable[..., UpstreamClient]


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def plain(status: int, body: bytes, *headers: bytes) -> bytes:
    extra = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%b\r\n%b" % (status, len(body), extra, body)


@pytest.fixture
async def clients() -> AsyncIterator[Make]:
    """Builds UpstreamClients from config settings; closes them all after the test."""
    made: list[UpstreamClient] = []

    def make(connect: float = 1.0, **upstream: object) -> UpstreamClient:
        config = config_from_dict({"timeouts": {"connect": connect}, "upstream": upstream})
        made.append(UpstreamClient(config))
        return made[-1]

    yield make
    for client in made:
        await client.close()


async def open_at(
    client: UpstreamClient,
    url: str,
    within: float = 2.0,
    request_id: str = "req-1",
    traceparent: str | None = None,
) -> Answer:
    first_byte_at = asyncio.get_running_loop().time() + within
    return await client.open("u0", url, PATH, BODY, request_id, first_byte_at, traceparent)


async def failure(client: UpstreamClient, url: str, within: float = 2.0) -> UpstreamError:
    with pytest.raises(UpstreamError) as caught:
        await open_at(client, url, within)
    assert caught.value.unit_id == "u0"
    return caught.value


async def test_a_streamed_answer_returns_with_its_first_bytes_then_its_connection_is_reused(
    clients: Make,
) -> None:
    go_on = asyncio.Event()
    peers: list[int] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(FIRST)
        await go_on.wait()
        await resp.write(REST)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post(PATH, chat)
    client = clients()
    async with serve_app(app) as url:
        answer = await open_at(client, url)
        # Back with the first event while the unit still holds the rest (until go_on).
        assert (answer.status, answer.content_type, answer.first) == (
            200,
            "text/event-stream",
            FIRST,
        )
        assert answer.streaming
        conn = answer.connection
        assert conn is not None and not conn.complete
        go_on.set()
        await asyncio.wait_for(conn.wait_for(lambda: conn.complete), 2.0)
        assert b"".join(conn.body) == REST
        client.finish(answer)
        assert answer.connection is None
        client.finish(answer)  # a second finish is a no-op

        again = await open_at(client, url)
        assert again.first.startswith(FIRST)
        assert len(peers) == 2 and peers[0] == peers[1]  # the same keep-alive connection
        client.finish(again)


async def test_finishing_a_stream_that_did_not_end_closes_its_connection(clients: Make) -> None:
    async with RawServer(lambda peer, _: peer.write(SSE_HEAD + chunk(FIRST))) as server:
        client = clients()
        answer = await open_at(client, server.url)
        assert answer.streaming and answer.first == FIRST
        client.finish(answer)
        assert answer.connection is None
        # The unit sees the abort, and the next request gets a connection of its own.
        await asyncio.wait_for(server.peers[0].closed.wait(), 1.0)
        again = await open_at(client, server.url)
        assert len(server.peers) == 2 and len(server.peers[0].requests) == 1
        client.finish(again)


async def test_a_stream_that_ended_cleanly_keeps_its_connection(clients: Make) -> None:
    async with RawServer(lambda peer, _: peer.write(SSE_HEAD + chunk(FIRST))) as server:
        client = clients()
        answer = await open_at(client, server.url)
        conn = answer.connection
        assert conn is not None
        server.peers[0].write(chunk(REST) + b"0\r\n\r\n")
        await asyncio.wait_for(conn.wait_for(lambda: conn.complete), 2.0)
        client.finish(answer)
        again = await open_at(client, server.url)
        assert len(server.peers) == 1 and len(server.peers[0].requests) == 2
        assert not server.peers[0].closed.is_set()
        client.finish(again)


async def test_a_whole_sse_answer_in_one_read_still_goes_to_the_relay(clients: Make) -> None:
    """Its events are read by the stream relay (an error event, a missing [DONE])."""
    sse = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%b"
    whole = FIRST + REST
    async with RawServer(lambda peer, _: peer.write(sse % (len(whole), whole))) as server:
        client = clients()
        answer = await open_at(client, server.url)
        assert answer.streaming and answer.first == whole
        assert answer.connection is not None and answer.connection.complete
        client.finish(answer)
        await open_at(client, server.url)
        assert len(server.peers) == 1  # it ended cleanly: kept


async def test_a_plain_answer_comes_whole_and_its_connection_goes_back_to_the_pool(
    clients: Make,
) -> None:
    peers: list[int] = []
    doc = {"id": "cmpl-1", "choices": [{"text": "hi"}]}

    async def completion(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        return web.json_response(doc)

    app = web.Application()
    app.router.add_post(PATH, completion)
    client = clients()
    async with serve_app(app) as url:
        answer = await open_at(client, url)
        assert not answer.streaming and answer.connection is None
        assert answer.status == 200 and answer.content_type.startswith("application/json")
        assert orjson.loads(answer.first) == doc
        client.finish(answer)  # nothing to hand back: a no-op
        await open_at(client, url)
        assert len(peers) == 2 and peers[0] == peers[1]


async def test_an_answer_that_says_connection_close_is_not_reused(clients: Make) -> None:
    answer = plain(200, b"{}", b"Content-Type: application/json", b"Connection: close")
    async with RawServer(lambda peer, _: peer.write(answer)) as server:
        client = clients()
        assert (await open_at(client, server.url)).first == b"{}"
        await asyncio.wait_for(server.peers[0].closed.wait(), 1.0)
        await open_at(client, server.url)
        assert len(server.peers) == 2


async def test_an_answer_without_content_type_or_length_ends_at_the_close(clients: Make) -> None:
    """A close-delimited body is complete at an orderly close; its type defaults to JSON."""

    def answer(peer: Peer, request: bytes) -> None:
        peer.write(b'HTTP/1.1 200 OK\r\n\r\n{"a": 1}')
        assert peer.transport is not None
        peer.transport.close()

    async with RawServer(answer) as server:
        got = await open_at(clients(), server.url)
        assert (got.status, got.content_type, got.first) == (200, "application/json", b'{"a": 1}')
        assert not got.streaming


async def test_an_interim_answer_is_skipped(clients: Make) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    final = plain(200, b"{}", b"Content-Type: application/json")
    async with RawServer(lambda peer, _: peer.write(interim + final)) as server:
        got = await open_at(clients(), server.url)
        assert (got.status, got.first) == (200, b"{}")


async def test_junk_after_a_complete_answer_keeps_the_answer_but_not_the_connection(
    clients: Make,
) -> None:
    answer = plain(200, b"{}", b"Content-Type: application/json") + b"NOT HTTP\r\n\r\n"
    async with RawServer(lambda peer, _: peer.write(answer)) as server:
        client = clients()
        assert (await open_at(client, server.url)).first == b"{}"
        await asyncio.wait_for(server.peers[0].closed.wait(), 1.0)
        await open_at(client, server.url)
        assert len(server.peers) == 2


async def test_a_4xx_answer_is_passed_on_not_raised(clients: Make) -> None:
    error = b'{"error": {"message": "bad model"}}'
    answer = plain(400, error, b"Content-Type: application/json")
    async with RawServer(lambda peer, _: peer.write(answer)) as server:
        got = await open_at(clients(), server.url)
        assert (got.status, got.first, got.streaming) == (400, error, False)


async def test_a_5xx_answer_is_a_retryable_status_failure(clients: Make) -> None:
    async def overloaded(request: web.Request) -> web.Response:
        return web.Response(status=503, text="engine overloaded")

    app = web.Application()
    app.router.add_post(PATH, overloaded)
    async with serve_app(app) as url:
        error = await failure(clients(), url)
    assert error.kind is Failure.STATUS and error.retryable
    assert error.upstream_status == 503 and error.status == 502
    assert "HTTP 503 engine overloaded" in error.detail


async def test_a_unit_that_accepts_but_never_answers_misses_the_first_byte_deadline(
    clients: Make,
) -> None:
    loop = asyncio.get_running_loop()
    async with RawServer(never) as server:
        start = loop.time()
        error = await failure(clients(), server.url, within=0.1)
        took = loop.time() - start
        assert error.kind is Failure.FIRST_BYTE_TIMEOUT and error.retryable
        assert error.status == 504
        assert 0.09 <= took < 0.5
        assert len(server.peers[0].requests) == 1  # it got the request...
        await asyncio.wait_for(server.peers[0].closed.wait(), 1.0)  # ...and sees the abort


async def test_a_reused_connection_that_never_answers_misses_the_first_byte_deadline(
    clients: Make,
) -> None:
    # The second request goes out at once on the kept connection (no connect, no slot to
    # wait for): its deadline is the connection's own timer, not a cancelling scope.
    answer = plain(200, b"{}", b"Content-Type: application/json")

    def first_only(peer: Peer, _: bytes) -> None:
        if len(peer.requests) == 1:
            peer.write(answer)

    loop = asyncio.get_running_loop()
    async with RawServer(first_only) as server:
        client = clients(max_connections=1)
        assert (await open_at(client, server.url)).status == 200
        start = loop.time()
        error = await failure(client, server.url, within=0.1)
        assert error.kind is Failure.FIRST_BYTE_TIMEOUT and error.retryable
        assert 0.09 <= loop.time() - start < 0.5
        assert len(server.peers) == 1 and len(server.peers[0].requests) == 2  # reused
        await asyncio.wait_for(server.peers[0].closed.wait(), 1.0)  # and aborted
        # Its slot came back: the next request connects anew rather than waiting for one.
        assert (await open_at(client, server.url)).status == 200
        assert len(server.peers) == 2


async def test_a_streamed_head_without_body_bytes_is_not_a_first_byte(clients: Make) -> None:
    async with RawServer(lambda peer, _: peer.write(SSE_HEAD)) as server:
        error = await failure(clients(), server.url, within=0.1)
    assert error.kind is Failure.FIRST_BYTE_TIMEOUT


@pytest.mark.parametrize(("connect", "within"), [(0.05, 2.0), (2.0, 0.05)])
async def test_no_handshake_in_time_is_a_connect_timeout(
    clients: Make, connect: float, within: float
) -> None:
    """Whichever ends first, the pool's connect timeout or the first-byte deadline."""
    loop = asyncio.get_running_loop()
    with full_backlog_url() as url:
        start = loop.time()
        error = await failure(clients(connect=connect), url, within=within)
        took = loop.time() - start
    assert error.kind is Failure.CONNECT_TIMEOUT and error.retryable and error.status == 504
    assert 0.04 <= took < 0.5


async def test_a_refused_connection_is_a_connect_failure(clients: Make) -> None:
    with refused_url() as url:
        error = await failure(clients(), url)
    assert error.kind is Failure.CONNECT and error.retryable and error.status == 502
    assert "ConnectionRefusedError" in error.detail


@pytest.mark.parametrize("close", ["reset", "fin"])
async def test_a_connection_broken_mid_headers_is_a_reset(clients: Make, close: str) -> None:
    def answer(peer: Peer, request: bytes) -> None:
        peer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        if close == "reset":
            peer.reset()
        else:
            assert peer.transport is not None
            peer.transport.close()

    async with RawServer(answer) as server:
        error = await failure(clients(), server.url)
    assert error.kind is Failure.RESET and error.retryable and error.status == 502
    assert ("reset by peer" in error.detail) is (close == "reset")


async def test_an_answer_that_is_not_http_is_a_protocol_failure(clients: Make) -> None:
    async with RawServer(lambda peer, _: peer.write(b"SSH-2.0-OpenSSH\r\n\r\n")) as server:
        error = await failure(clients(), server.url)
    assert error.kind is Failure.PROTOCOL and error.retryable
    assert "invalid HTTP" in error.detail


async def test_the_request_id_and_traceparent_go_upstream(clients: Make) -> None:
    seen: list[tuple[str, CIMultiDict[str], bytes]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.copy(), await request.read()))
        return web.json_response({})

    app = web.Application()
    app.router.add_post(PATH, record)
    client = clients()
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with serve_app(app) as url:
        await open_at(client, url, request_id="req-42", traceparent=trace)
        await open_at(client, url, request_id="req-43")
    (path, first, body), (_, second, _) = seen
    assert path == PATH and body == BODY
    assert first["x-request-id"] == "req-42" and first["traceparent"] == trace
    assert first["Content-Type"] == "application/json"
    assert first["Host"] == url.removeprefix("http://")
    assert second["x-request-id"] == "req-43" and "traceparent" not in second


async def test_cancellation_passes_unchanged_and_closes_the_connection(clients: Make) -> None:
    async with RawServer(never) as server:
        task = asyncio.create_task(open_at(clients(), server.url, within=5.0))
        await until(lambda: bool(server.peers and server.peers[0].requests), 1.0, "sent")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.peers[0].closed.wait(), 1.0)


async def test_a_held_stream_holds_its_connection_slot_until_finished(clients: Make) -> None:
    async with RawServer(lambda peer, _: peer.write(SSE_HEAD + chunk(FIRST))) as server:
        client = clients(max_connections=1)
        held = await open_at(client, server.url)
        # No slot (the limit is gateway-wide): the next request never gets to connect, and
        # the wait is the gateway's own limit (LOCAL: no evidence against the unit, 503).
        error = await failure(client, server.url, within=0.05)
        assert error.kind is Failure.LOCAL and not error.retryable and error.status == 503
        assert len(server.peers) == 1
        client.finish(held)
        client.finish(await open_at(client, server.url))
        assert len(server.peers) == 2


async def test_a_failed_attempt_gives_its_connection_slot_back(clients: Make) -> None:
    async with RawServer(never) as server:
        client = clients(max_connections=1)
        for _ in range(2):  # the second reaches the unit too: not stuck behind the first
            assert (await failure(client, server.url, 0.05)).kind is Failure.FIRST_BYTE_TIMEOUT
        assert [len(p.requests) for p in server.peers] == [1, 1]


async def test_closing_the_client_closes_its_idle_connections(clients: Make) -> None:
    answer = plain(200, b"{}", b"Content-Type: application/json")
    async with RawServer(lambda peer, _: peer.write(answer)) as server:
        client = clients()
        await open_at(client, server.url)
        assert not server.peers[0].closed.is_set()  # idle in the pool
        await client.close()
        await asyncio.wait_for(server.peers[0].closed.wait(), 1.0)
