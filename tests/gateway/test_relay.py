"""The stream relay built on its own: an aiohttp server whose handler builds a StreamRelay over
the real request it got, fed by a real UpstreamClient's answer from a raw unit on 127.0.0.1
whose bytes each test scripts, read by a real aiohttp client. What reaches the client (the
unit's bytes, unchanged and in order, as HTTP chunks; the gateway's error event), how each
answer ends (every End the relay can say), back-pressure, and the gaps it records."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.config import config_from_dict
from gateway.outcomes import End
from gateway.proxy.relay import HIGH_WATER, StreamRelay
from gateway.proxy.tracker import StreamTracker
from gateway.proxy.upstream import Answer, UpstreamClient
from tests.gateway.servers import Peer, RawServer, serve_app, until

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


class Gaps:
    """A GapSink that keeps what it is given."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)


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
        relay = StreamRelay(
            request,
            {"x-unitgate-unit": "u0"},
            loop.time() + self.within,
            self.idle,
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
        assert relay.response is not None
        return relay.response

    async def end(self, within: float = 3.0) -> End:
        return await asyncio.wait_for(asyncio.shield(self.ended), within)


@pytest.fixture
async def upstream() -> AsyncIterator[UpstreamClient]:
    client = UpstreamClient(config_from_dict({"timeouts": {"connect": 1.0}}))
    yield client
    await client.close()


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


async def test_bytes_are_relayed_unchanged_in_order_as_http_chunks(
    upstream: UpstreamClient,
) -> None:
    pieces = [
        b'data: {"n": 2}\n\n',
        b": a comment, relayed as it is\n\n",
        'data: {"text": "héllo ✓"}\n\n'.encode(),
        b'data: {"n": 3, "half": "of an ev',  # a verbatim relay passes reads as they come
        b'ent"}\n\ndata: {"n": 4}\n\n',
        b"data: x\r\n\r\n",
        DONE,
    ]
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url)
        async with stream_of(relayed) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/event-stream"
            assert resp.headers["Transfer-Encoding"] == "chunked"
            assert resp.headers["x-unitgate-unit"] == "u0"
            assert await next_chunk(resp) == FIRST  # sent with the head
            for piece in pieces:  # in lockstep: one read upstream, one chunk to the client
                unit.peers[0].write(chunk(piece))
                assert await next_chunk(resp) == piece
            unit.peers[0].write(LAST_CHUNK)
            assert await relayed.end() is End.COMPLETE
            assert await asyncio.wait_for(resp.read(), 2.0) == b""  # a clean end of the body
        # One gap observed per relayed chunk (the first bytes went with the head).
        assert len(relayed.gaps.values) == len(pieces)
        assert all(gap >= 0 for gap in relayed.gaps.values)
        assert relayed.relay is not None and relayed.relay.gap is not None
        assert not relayed.unit_closed  # the answer ended cleanly: its connection is kept
        assert len(unit.peers[0].requests) == 1 and not unit.peers[0].closed.is_set()


async def test_bytes_that_came_before_the_pump_are_relayed_first(
    upstream: UpstreamClient,
) -> None:
    rest = [b'data: {"n": 2}\n\n', b'data: {"n": 3}\n\n']
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url)

        async def arrive(answer: Answer) -> None:  # while the head was being sent
            conn = answer.connection
            assert conn is not None
            for piece in rest:
                unit.peers[0].write(chunk(piece))
            await until(lambda: b"".join(conn.body) == b"".join(rest), 2.0, "rest read")

        relayed.before_pump = arrive
        async with stream_of(relayed) as resp:
            assert await next_chunk(resp) == FIRST
            assert await next_chunk(resp) == b"".join(rest)
            unit.peers[0].write(chunk(DONE) + LAST_CHUNK)
            assert await next_chunk(resp) == DONE
            assert await relayed.end() is End.COMPLETE


async def test_an_answer_complete_before_the_pump_is_relayed_whole(
    upstream: UpstreamClient,
) -> None:
    whole = FIRST + DONE
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%b"
    async with RawServer(lambda peer, _: peer.write(answer % (len(whole), whole))) as unit:
        relayed = Relayed(upstream, unit.url)
        async with stream_of(relayed) as resp:
            assert await asyncio.wait_for(resp.read(), 2.0) == whole
            assert await relayed.end() is End.COMPLETE


async def test_an_upstream_reset_mid_stream_ends_with_an_error_event_and_done(
    upstream: UpstreamClient,
) -> None:
    middle = b'data: {"n": 2}\n\n'
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url)
        async with stream_of(relayed) as resp:
            assert await next_chunk(resp) == FIRST
            unit.peers[0].write(chunk(middle))
            assert await next_chunk(resp) == middle
            unit.peers[0].reset()
            assert await relayed.end() is End.RESET
            rest = await asyncio.wait_for(resp.read(), 2.0)  # ends cleanly, chunked EOF
        error, done = events(rest)  # nothing before the error event: it was not mid-event
        assert error_event(error) == {
            "message": End.RESET.message,
            "type": "upstream_error",
            "param": None,
            "code": "reset",
        }
        assert done + b"\n\n" == DONE


async def test_a_half_written_event_is_closed_before_the_error_event(
    upstream: UpstreamClient,
) -> None:
    half = b'data: {"n": 2, "te'
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url, detail="no unit left")
        async with stream_of(relayed) as resp:
            assert await next_chunk(resp) == FIRST
            unit.peers[0].write(chunk(half))
            assert await next_chunk(resp) == half
            unit.peers[0].reset()
            assert await relayed.end() is End.RESET
            rest = await asyncio.wait_for(resp.read(), 2.0)
        assert rest.startswith(b"\n\n")  # the broken event is ended, on its own
        broken, error, done = events(half + rest)
        assert broken == half
        message = error_event(error)["message"]
        assert message == f"{End.RESET.message}; not resumed: no unit left"
        assert done + b"\n\n" == DONE


async def test_a_unit_silent_for_the_idle_time_is_an_idle_timeout(
    upstream: UpstreamClient,
) -> None:
    loop = asyncio.get_running_loop()
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url, idle=0.1)
        async with stream_of(relayed) as resp:
            assert await next_chunk(resp) == FIRST
            start = loop.time()
            assert await relayed.end() is End.IDLE_TIMEOUT
            assert 0.09 <= loop.time() - start < 1.0
            error, _ = events(await asyncio.wait_for(resp.read(), 2.0))
            assert error_event(error)["code"] == "idle_timeout"
        # The pump's watchdog failed the answer; the handler's finish closed the connection.
        await asyncio.wait_for(unit.peers[0].closed.wait(), 1.0)


async def test_the_idle_time_counts_from_the_last_data_not_the_start(
    upstream: UpstreamClient,
) -> None:
    """Tokens 30 ms apart for longer than the idle time (0.2 s) are not idle."""
    tokens = [b'data: {"t": %d}\n\n' % i for i in range(12)]
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url, idle=0.2)
        async with stream_of(relayed) as resp:
            assert await next_chunk(resp) == FIRST
            for token in tokens:
                await asyncio.sleep(0.03)  # the unit's pace
                unit.peers[0].write(chunk(token))
                assert await next_chunk(resp) == token
            unit.peers[0].write(LAST_CHUNK)
            assert await relayed.end() is End.COMPLETE


async def test_an_answer_past_its_deadline_is_a_total_timeout(upstream: UpstreamClient) -> None:
    loop = asyncio.get_running_loop()
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url, idle=5.0, within=0.25)
        async with stream_of(relayed) as resp:
            assert await next_chunk(resp) == FIRST
            start = loop.time()
            n = 0
            while not relayed.ended.done() and n < 100:  # tokens keep coming: never idle
                n += 1
                unit.peers[0].write(chunk(b"data: %d\n\n" % n))
                await asyncio.sleep(0.02)
            assert await relayed.end() is End.TOTAL_TIMEOUT
            assert loop.time() - start < 1.0 and n >= 3
            body = await asyncio.wait_for(resp.read(), 2.0)
        error = events(body)[-2]
        assert error_event(error)["code"] == "total_timeout"


async def test_a_client_that_leaves_is_client_gone_and_its_unit_is_cut_off(
    upstream: UpstreamClient,
) -> None:
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url)
        # No handler cancellation (aiohttp's default; the gateway turns it on): the relay
        # itself notices the client gone, at the next bytes the unit sends.
        async with stream_of(relayed, handler_cancellation=False) as resp:
            assert await next_chunk(resp) == FIRST
            assert resp.connection is not None and resp.connection.transport is not None
            resp.connection.transport.abort()  # the client vanishes
            client = relayed.client
            assert client is not None
            await until(client.is_closing, 2.0, "the gateway sees the client gone")
            assert not relayed.ended.done()  # nothing to relay yet: nothing noticed
            unit.peers[0].write(chunk(b'data: {"n": 2}\n\n'))
            assert await relayed.end() is End.CLIENT_GONE
        assert relayed.unit_closed  # cut off by the pump, before the handler's finish
        await asyncio.wait_for(unit.peers[0].closed.wait(), 1.0)


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


@pytest.mark.parametrize("done", [True, False])
async def test_a_tracked_stream_is_complete_only_with_done(
    upstream: UpstreamClient, done: bool
) -> None:
    """A resumable stream's bytes pass through its tracker (token ids hidden, id-only chunks
    dropped); a body that ends cleanly without [DONE] is TRUNCATED."""
    tokens = [chat_event("Hel", [7]), chat_event("", [8]), chat_event("lo", [9])]
    tail = [chat_event("", [], "stop"), DONE] if done else []
    async with RawServer(starts_with(OPENING)) as unit:
        tracker = tracked()
        relayed = Relayed(upstream, unit.url, tracker=tracker)
        async with stream_of(relayed) as resp:
            got = [await next_chunk(resp)]
            for event in tokens + tail:
                unit.peers[0].write(chunk(event))
                if event != tokens[1]:  # ids only, no text: not shown to the client
                    got.append(await next_chunk(resp))
            unit.peers[0].write(LAST_CHUNK)
            assert await relayed.end() is (End.COMPLETE if done else End.TRUNCATED)
            rest = await asyncio.wait_for(resp.read(), 2.0)
        assert tracker.generated == [7, 8, 9] and tracker.committed == 3
        shown = [orjson.loads(e[6:]) for e in got if e != DONE]
        assert all("token_ids" not in c["choices"][0] for c in shown)
        assert "prompt_token_ids" not in shown[0]
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in shown) == "Hello"
        # Gaps: one per chunk written to the client, none for the chunk the tracker dropped.
        assert len(relayed.gaps.values) == len(got) - 1
        if done:
            assert got[-1] == DONE and rest == b""
        else:
            error, final = events(rest)
            assert error_event(error)["code"] == "truncated" and final + b"\n\n" == DONE


@pytest.mark.parametrize("with_end", [False, True])
async def test_an_error_event_from_the_unit_is_a_unit_error(
    upstream: UpstreamClient, with_end: bool
) -> None:
    """Also when it comes in the same read as the end of the body: the answer is not
    complete, whatever the framing says."""
    error = b'data: {"error": {"message": "engine died"}}\n\n'
    async with RawServer(starts_with(OPENING)) as unit:
        relayed = Relayed(upstream, unit.url, tracker=tracked())
        async with stream_of(relayed) as resp:
            await next_chunk(resp)
            unit.peers[0].write(chunk(chat_event("Hi", [7])))
            await next_chunk(resp)
            unit.peers[0].write(chunk(error + DONE) + LAST_CHUNK if with_end else chunk(error))
            assert await relayed.end() is End.UNIT_ERROR
            rest = await asyncio.wait_for(resp.read(), 2.0)
        assert relayed.unit_closed  # aborted by the pump: nothing more is read from it
        assert b"engine died" not in rest  # the unit's own error event is not relayed
        ours, done = events(rest)
        assert error_event(ours)["code"] == "unit_error" and done + b"\n\n" == DONE


async def test_an_ejected_units_quiet_stream_breaks_at_once(upstream: UpstreamClient) -> None:
    loop = asyncio.get_running_loop()
    async with RawServer(starts_with(OPENING)) as unit:
        relayed = Relayed(upstream, unit.url, idle=5.0, tracker=tracked(), quiet=(0.1, 4.0))
        async with stream_of(relayed) as resp:
            await next_chunk(resp)
            relay = relayed.relay
            assert relay is not None
            pace = relay.pace()
            assert pace is not None and pace[0] <= loop.time()
            # Quiet for longer than its pace allows (0.1 s at least), then its unit is ejected.
            await until(lambda: loop.time() - pace[0] > 0.15, 2.0, "quiet")
            ejected = loop.time()
            assert relay.on_unit_ejected("probe failed")
            assert await relayed.end() is End.UNIT_EJECTED
            assert loop.time() - ejected < 0.1  # at once, not at the idle time (5 s)
            ours, _ = events(await asyncio.wait_for(resp.read(), 2.0))
            assert error_event(ours)["code"] == "unit_ejected"
        assert relay.pace() is None  # no answer relayed now
        assert not relay.on_unit_ejected("again")  # between answers: nothing to break


@pytest.mark.parametrize("then", ["done", "quiet"])
async def test_an_ejected_units_stream_still_receiving_tokens_goes_on(
    upstream: UpstreamClient, then: str
) -> None:
    """Tokens 20 ms apart keep it going (its pace allows 0.2 s of quiet); if it then goes
    quiet it breaks by that pace, long before the idle time."""
    loop = asyncio.get_running_loop()
    async with RawServer(starts_with(OPENING)) as unit:
        relayed = Relayed(upstream, unit.url, idle=5.0, tracker=tracked(), quiet=(0.2, 4.0))
        async with stream_of(relayed) as resp:
            await next_chunk(resp)
            assert relayed.relay is not None
            for i in range(15):
                if i == 3:
                    assert relayed.relay.on_unit_ejected("probe failed")
                unit.peers[0].write(chunk(chat_event("x", [i])))
                await next_chunk(resp)
                await asyncio.sleep(0.02)
            assert not relayed.ended.done()
            if then == "done":
                unit.peers[0].write(chunk(chat_event("", [], "stop") + DONE) + LAST_CHUNK)
                assert await relayed.end() is End.COMPLETE
            else:
                last = loop.time()
                assert await relayed.end() is End.UNIT_EJECTED
                assert 0.15 <= loop.time() - last < 2.0


async def test_a_plain_stream_is_not_broken_by_an_ejection(upstream: UpstreamClient) -> None:
    """Without a tracker it cannot be resumed elsewhere: it runs to its end."""
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url, idle=5.0, quiet=(0.01, 1.0))
        async with stream_of(relayed) as resp:
            await next_chunk(resp)
            assert relayed.relay is not None
            assert not relayed.relay.on_unit_ejected("probe failed")
            unit.peers[0].write(chunk(DONE) + LAST_CHUNK)
            assert await next_chunk(resp) == DONE
            assert await relayed.end() is End.COMPLETE


SIZE, PIECE = 2 * 1024 * 1024, 64 * 1024  # 2 MiB in 64 KiB chunks: pauses after < 1 MiB


def payload() -> list[bytes]:
    return [bytes([65 + i % 26]) * PIECE for i in range(SIZE // PIECE)]


def small_send_buffer(relayed: Relayed) -> Callable[[Answer], Awaitable[None]]:
    """Shrinks the kernel's send buffer towards the client, so that what a client that does
    not read leaves unsent piles up in the gateway after a few hundred KiB, not megabytes."""

    async def shrink(answer: Answer) -> None:
        assert relayed.client is not None
        sock = relayed.client.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    return shrink


async def test_a_client_that_does_not_read_pauses_the_unit_until_it_drains(
    upstream: UpstreamClient,
) -> None:
    pieces = payload()
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url, idle=0.2)
        relayed.before_pump = small_send_buffer(relayed)
        async with stream_of(relayed, read_bufsize=4096) as resp:
            assert await next_chunk(resp) == FIRST
            unit.peers[0].write(b"".join(map(chunk, pieces)) + LAST_CHUNK)
            answer, client = relayed.answer, relayed.client
            assert answer is not None and client is not None
            conn = answer.connection
            assert conn is not None and conn.transport is not None
            transport = conn.transport
            await until(lambda: not transport.is_reading(), 2.0, "upstream reading paused")
            assert client.get_write_buffer_size() > HIGH_WATER
            # Paused for longer than the idle time (0.2 s): not idle, the client is slow.
            await asyncio.sleep(0.4)
            assert not relayed.ended.done() and not transport.is_reading()
            assert not conn.complete  # the unit's bytes wait upstream, not in the gateway
            body = await asyncio.wait_for(resp.read(), 5.0)  # the client drains: it resumes
            assert await relayed.end() is End.COMPLETE
        assert body == b"".join(pieces)


async def test_a_client_that_leaves_while_not_reading_is_client_gone(
    upstream: UpstreamClient,
) -> None:
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url)
        relayed.before_pump = small_send_buffer(relayed)
        async with stream_of(relayed, handler_cancellation=False, read_bufsize=4096) as resp:
            assert await next_chunk(resp) == FIRST
            unit.peers[0].write(b"".join(map(chunk, payload())))
            answer = relayed.answer
            assert answer is not None and answer.connection is not None
            transport = answer.connection.transport
            assert transport is not None
            await until(lambda: not transport.is_reading(), 2.0, "upstream reading paused")
            assert resp.connection is not None and resp.connection.transport is not None
            resp.connection.transport.abort()
            assert await relayed.end() is End.CLIENT_GONE
        await asyncio.wait_for(unit.peers[0].closed.wait(), 1.0)
