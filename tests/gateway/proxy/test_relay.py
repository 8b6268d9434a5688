"""The stream relay built on its own: an aiohttp server whose handler builds a StreamRelay over
the real request it got, fed by a real UpstreamClient's answer from a raw unit on 127.0.0.1
whose bytes each test scripts, read by a real aiohttp client (tests/gateway/proxy/relay_support.py).
What reaches the client (the unit's bytes, unchanged and in order, as HTTP chunks; the gateway's
error event), how each answer ends (complete, reset, truncated, a unit's error, the idle and
total timeouts), and the gaps it records. Ejections: test_relay_ejection.py; a client that
leaves or does not read: test_relay_client.py."""

from __future__ import annotations

import asyncio
import gc
import os

import aiohttp
import orjson
import pytest

from gateway.outcomes import End
from gateway.proxy.upstream import Answer, UpstreamClient
from tests.gateway.proxy.relay_support import (
    DONE,
    FIRST,
    LAST_CHUNK,
    OPENING,
    PATH,
    SSE_HEAD,
    Relayed,
    chat_event,
    chunk,
    error_event,
    events,
    next_chunk,
    starts_with,
    stream_of,
    tracked,
)
from tests.gateway.servers import RawServer, serve_app, until

pytestmark = pytest.mark.both_relays


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
        assert relayed.gaps.count == len(pieces)
        assert relayed.gaps.sum >= 0
        assert relayed.relay is not None and relayed.relay.gap is not None
        assert not relayed.unit_closed  # the answer ended cleanly: its connection is kept
        assert len(unit.peers[0].requests) == 1 and not unit.peers[0].closed.is_set()


async def test_an_open_stream_holds_no_copy_of_its_first_bytes(upstream: UpstreamClient) -> None:
    """Thousands of streams stay open at once: an answer's first bytes, once relayed, are kept
    by nothing of the gateway's (a list in the relay's frame held them for the stream's life).
    They are this test's own (a random mark), so no other module's constant matches them."""
    first = b'data: {"mark": "%s"}\n\n' % os.urandom(8).hex().encode()

    def holds_a_copy(o: object) -> bool:
        return any(
            type(r) is bytes and r is not first and r.startswith(first) for r in gc.get_referents(o)
        )

    async with RawServer(starts_with(first)) as unit:
        relayed = Relayed(upstream, unit.url)
        async with stream_of(relayed) as resp:
            assert await next_chunk(resp) == first
            gc.collect()
            assert [type(o).__name__ for o in gc.get_objects() if holds_a_copy(o)] == []
            unit.peers[0].write(LAST_CHUNK)
            assert await relayed.end() is End.COMPLETE


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
            expected = FIRST + b"".join(rest)  # the first bytes, then the rest, in order
            got = b""
            while len(got) < len(expected):
                got += await next_chunk(resp)
            assert got == expected
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
    """Tokens 50 ms apart for longer than the idle time (1 s) are not idle. The margin is wide
    (0.95 s a gap): with 0.2 s and 30 ms, a loop late by 170 ms under a loaded CI machine
    failed it."""
    tokens = [b'data: {"t": %d}\n\n' % i for i in range(30)]
    async with RawServer(starts_with(FIRST)) as unit:
        relayed = Relayed(upstream, unit.url, idle=1.0)
        async with stream_of(relayed) as resp:
            assert await next_chunk(resp) == FIRST
            for token in tokens:  # 1.5 s in all
                await asyncio.sleep(0.05)  # the unit's pace
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
        assert relayed.gaps.count == len(got) - 1
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


async def test_first_bytes_after_a_head_sent_alone_reach_the_client_at_once(
    upstream: UpstreamClient,
) -> None:
    """A unit that sends its head, then its first event later: the request task hears of the
    first bytes when they come, not when the answer ends (the native relay once woke it only
    at the end)."""
    async with RawServer(lambda peer, _: peer.write(SSE_HEAD)) as unit:
        relayed = Relayed(upstream, unit.url)
        async with serve_app(relayed.app) as url, aiohttp.ClientSession() as http:
            request = asyncio.ensure_future(http.post(url + PATH, data=b"{}"))
            await until(lambda: bool(unit.peers), 2.0, "the gateway connecting to the unit")
            await asyncio.sleep(0.05)  # the head alone has been read by now
            unit.peers[0].write(chunk(FIRST))
            resp = await asyncio.wait_for(request, 2.0)
            async with resp:
                assert await next_chunk(resp) == FIRST
                assert not relayed.ended.done()  # the unit has not finished its answer
                unit.peers[0].write(chunk(DONE) + LAST_CHUNK)
                assert await relayed.end() is End.COMPLETE
