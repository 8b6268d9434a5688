"""Fuzzing the gateway over real sockets: hostile clients (test_unit_fuzz.py: a misbehaving
unit).

Properties: a client-caused problem gets a 4xx (never a 5xx, never a traceback in the gateway's
log) or a clean close; nothing hangs (every exchange has a deadline); the gateway's memory
stays flat; and a control stream next to it all stays byte-identical.
"""

from __future__ import annotations

import itertools
import threading
import time

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.harness import (
    DEADLINE,
    DONE,
    MAX_BODY,
    TIMEOUTS,
    Control,
    GatewayProcess,
    RawUnit,
    Reply,
    Script,
    check_error,
    exchange,
    post,
    post_head,
)
from tests.fuzz.strategies import HTTP_FUZZ, hostile_body
from tests.support import MODEL

pytestmark = pytest.mark.both_relays


def check_answer(reply: Reply, stream: bool) -> None:
    assert reply.complete
    if stream:
        assert reply.body.endswith(b"data: [DONE]\n\n"), reply.body[-200:]
    else:
        assert reply.json()["object"] == "chat.completion"


# -- hostile bodies --------------------------------------------------------------------------

HEADER_VARIANTS = [
    b"",
    b"Content-Type: text/plain\r\n",
    b"Content-Encoding: gzip\r\n",
    b"Content-Encoding: deflate\r\n",
    b"Content-Encoding: br\r\n",
    b"Expect: 100-continue\r\n",
    b"x-request-id: " + b"r" * 300 + b"\r\n",
    b"x-session-id: \xff\xfe\r\n",
]


def test_hostile_bodies_get_4xx_or_an_answer(gw: GatewayProcess, control: Control) -> None:
    counter = itertools.count()

    @settings(HTTP_FUZZ, max_examples=120)
    @given(body=hostile_body(MAX_BODY), extra=st.sampled_from(HEADER_VARIANTS))
    def run(body: bytes, extra: bytes) -> None:
        head = post_head(len(body), session=gw.sessions["u0"], extra=extra)
        if extra.startswith(b"Content-Type"):
            head = head.replace(b"Content-Type: application/json\r\n", b"", 1)
        if extra.startswith(b"x-request-id"):
            head = head.replace(b"x-request-id: ", b"x-request-id: bad", 1)
        reply = exchange(gw.port, [(head + body, 0.0)], deadline=DEADLINE)
        next(counter)
        assert reply.status is not None, "no answer to a complete request"
        assert reply.status < 500, (reply.status, reply.body[:300])
        if reply.headers.get("x-request-id"):  # a client's id only if sane, else a new one
            assert len(reply.headers["x-request-id"]) <= 128
        if reply.status == 200:
            stream = bool(orjson.loads(body).get("stream"))
            check_answer(reply, stream)
            assert reply.headers["x-unitgate-unit"] == "u0"
        else:
            assert reply.status in (400, 404, 413, 415), (reply.status, reply.body[:300])
            if not reply.headers.get("content-type", "").startswith("text/plain"):
                check_error(reply)  # else refused by aiohttp's HTTP parser (say, br unsupported)

    with control():
        run()
    assert next(counter) >= 100


# -- broken HTTP framing from the client ----------------------------------------------------

VALID = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})


@st.composite
def broken_request(draw: st.DrawFn, session: str) -> tuple[list[tuple[bytes, float]], bool, bool]:
    """(pieces, half_close, complete): requests cut, mis-framed or malformed at the HTTP level."""
    kind = draw(
        st.sampled_from(
            [
                "truncated",
                "short_length",
                "bad_length",
                "bad_chunks",
                "bad_head",
                "no_body",
                "split",
            ]
        )
    )
    body = draw(st.sampled_from([VALID, b"{oops", b"\xff" * 10]))
    if kind == "truncated":  # the client promises more than it sends, then closes its side
        cut = draw(st.integers(0, len(body) - 1))
        extra = draw(st.integers(1, 10_000))
        return [(post_head(len(body) + extra, session=session) + body[:cut], 0.0)], True, False
    if kind == "short_length":
        return [(post_head(len(body) // 2, session=session) + body, 0.0)], False, True
    if kind == "bad_length":
        value = draw(st.sampled_from([b"abc", b"-1", b"1e3", b"99999999999999999999", b"5, 6"]))
        head = post_head(None, session=session, extra=b"Content-Length: " + value + b"\r\n")
        return [(head + body, 0.0)], True, True
    if kind == "bad_chunks":
        size = draw(
            st.sampled_from([b"zz", b"-5", b"fffffffffffffffffff", b"1;" + b"e" * 9000, b""])
        )
        head = post_head(None, session=session, extra=b"Transfer-Encoding: chunked\r\n")
        return [(head + size + b"\r\n" + body + b"\r\n0\r\n\r\n", 0.0)], True, True
    if kind == "bad_head":
        head = draw(
            st.sampled_from(
                [
                    b"POST /v1/chat/completions HTTP/9.9\r\n\r\n",
                    b"GARBAGE\r\n\r\n",
                    b"POST /v1/chat/completions HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n",
                    b"POST /v1/chat/completions HTTP/1.1\r\nBad Header\r\n\r\n",
                    b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n",
                    b"\x00\xff\x16\x03\x01\r\n\r\n",
                ]
            )
        )
        return [(head, 0.0)], True, True
    if kind == "no_body":
        return [(post_head(None, session=session), 0.0)], draw(st.booleans()), True
    # split: a complete request in pieces with pauses (a slow but honest client)
    data = post_head(len(body), session=session) + body
    cuts = sorted(draw(st.lists(st.integers(1, len(data) - 1), max_size=4, unique=True)))
    bounds = [0, *cuts, len(data)]
    return [(data[a:b], 0.05) for a, b in itertools.pairwise(bounds)], False, True


def test_broken_framing_gets_4xx_or_a_clean_close(gw: GatewayProcess, control: Control) -> None:
    @settings(HTTP_FUZZ, max_examples=80)
    @given(case=broken_request(gw.sessions["u0"]))
    def run(case: tuple[list[tuple[bytes, float]], bool, bool]) -> None:
        pieces, half_close, complete = case
        reply = exchange(gw.port, pieces, half_close=half_close, deadline=DEADLINE)
        if reply.status is None:
            # Only a request the client never finished may go unanswered, and then the
            # gateway must close the connection rather than leave it hanging.
            assert reply.closed
            assert not complete or half_close, "a complete request got no answer"
            return
        assert reply.status < 500, (reply.status, reply.body[:300])
        if reply.status != 200:
            assert 400 <= reply.status < 500

    with control():
        run()


# -- slow clients ----------------------------------------------------------------------------


@pytest.mark.slow
def test_slow_clients_are_bounded_and_harm_no_one(gw: GatewayProcess, control: Control) -> None:
    """A byte a second: an honest slow body completes; a body that never ends gets 408 once the
    `total` timeout passes; a trickled head holds only its own connection."""
    total = TIMEOUTS["total"]
    session = gw.sessions["u0"]
    body = orjson.dumps(
        {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    honest = [(post_head(len(body), session=session), 0.0)]
    honest += [(body[i : i + 1], 1.0) for i in range(3)] + [(body[3:], 0.0)]
    endless = [(post_head(len(body) + 1000, session=session), 0.0)]
    endless += [(b" ", 1.0) for _ in range(int(total) + 1)]  # stops sending after total + 1 s
    head = post_head(len(body), session=session)
    slow_head = [(head[i : i + 1], 1.0) for i in range(3)]
    replies: dict[str, list[Reply]] = {"honest": [], "endless": [], "slow_head": []}

    def client(name: str, pieces: list[tuple[bytes, float]]) -> None:
        if name == "slow_head":  # an unfinished head, then gone: nothing to answer
            reply = exchange(gw.port, pieces, half_close=True, deadline=DEADLINE + 4)
            assert reply.status is None or reply.status == 400
            replies[name].append(reply)
            return
        replies[name].append(exchange(gw.port, pieces, deadline=DEADLINE + 4))

    plan = [("honest", honest)] * 3 + [("endless", endless)] * 3 + [("slow_head", slow_head)] * 3
    with control():
        threads = [threading.Thread(target=client, args=item) for item in plan]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE + 10)
        assert not any(t.is_alive() for t in threads)
    # A client thread that failed (no answer by its deadline) left no reply behind.
    assert [len(r) for r in replies.values()] == [3, 3, 3], replies
    for reply in replies["honest"]:
        assert reply.status == 200
        check_answer(reply, stream=True)
    for reply in replies["endless"]:
        assert reply.status == 408, (reply.status, reply.body)
        assert reply.json()["error"]["code"] == "body_timeout"


# -- memory ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_memory_stays_flat_under_abuse(gw: GatewayProcess, control: Control) -> None:
    """Rounds of large hostile bodies; after a warm-up round the gateway's RSS must stay flat.

    A round sends 102 bodies of up to 64 KiB, 85 of them read whole by the gateway (~5 MiB).
    Retaining them would grow the RSS by ~10 MiB over the two measured rounds (checked: a
    handler keeping every body fails here with +10 MiB); without a leak it moves well under
    1 MiB. The 5 MiB bound leaves room for allocator and buffer-pool noise."""
    session = gw.sessions["u0"]
    big = "x" * (MAX_BODY - 200)
    shapes = [
        orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": big}]}),  # valid
        b'{"model": "' + big.encode() + b'"',  # truncated JSON
        b'{"model": "nope", "messages": [{"role": "user", "content": "' + big.encode() + b'"}]}',
        b"[" * 1100 + b"]" * 1100 + big.encode()[:40_000],  # too deep
        b'{"model": "' + MODEL.encode() + b'", "messages": "\xff' + big.encode() + b'"}',
        big.encode() * 2,  # 413
    ]

    def one_round() -> None:
        for i in range(102):
            reply = post(gw.port, shapes[i % len(shapes)], session=session, deadline=DEADLINE)
            assert reply.status in (200, 400, 404, 413), reply.status

    with control():
        one_round()
        time.sleep(0.2)
        before = gw.rss_kib()
        one_round()
        one_round()
        time.sleep(0.2)
        after = gw.rss_kib()
    print(f"gateway RSS {before} -> {after} KiB")
    assert after - before < 5 * 1024, f"RSS grew {before} -> {after} KiB"


@pytest.mark.slow
def test_a_client_that_stops_reading_is_not_buffered_for(
    gw: GatewayProcess, raw_unit: RawUnit, control: Control
) -> None:
    """A unit streams 24 MiB as fast as it can to a client that stops reading for a second.

    The gateway must pause reading from the unit (its high-water mark is 256 KiB), not buffer
    the stream: kernel socket buffers absorb a few MiB, the rest (well over 10 MiB) would
    land in the gateway's RSS if it buffered. The bound is 4 MiB."""
    event = b"data: " + b"y" * 1000 + b"\n\n"
    payload = event * (24 * 1024 * 1024 // len(event)) + DONE
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(payload)
    raw_unit.expect("flood", Script([(head + payload, 0.0)], "keep"))
    body = orjson.dumps(
        {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    )
    rss: list[int] = []

    def stop_reading() -> None:
        rss.append(gw.rss_kib())
        time.sleep(1.0)
        rss.append(gw.rss_kib())

    with control():
        reply = post(
            gw.port, body, session=gw.sessions["raw"], request_id="flood", stall=stop_reading
        )
    assert reply.status == 200 and reply.complete
    assert reply.body == payload  # every byte, once the client reads again
    assert rss[1] - rss[0] < 4 * 1024, f"RSS grew {rss[0]} -> {rss[1]} KiB while not reading"
