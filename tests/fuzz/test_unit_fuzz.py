"""Fuzzing the gateway with a misbehaving unit, over real sockets: arbitrary statuses, content
types, framings (chunked, length, close) and SSE-ish bytes, cut, reset, stalled or garbled.

Properties: the client gets a 502/504 with a JSON error, or the unit's stream relayed (byte for
byte by the plain relay, whole events by the resumable one) up to the break and then an SSE
error event; never a 500, never a hang; a control stream next to it stays byte-identical.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.harness import (
    DEADLINE,
    DONE,
    Control,
    GatewayProcess,
    RawUnit,
    Script,
    check_error,
    post,
)
from tests.fuzz.strategies import HTTP_FUZZ
from tests.support import MODEL

ERROR_EVENT = b'data: {"error":'
EVENT_END = re.compile(rb"\r?\n\r?\n")
# An error event the gateway wrote (then [DONE]).
ERROR_TAIL = re.compile(rb'data: \{"error":.*\}\n\n(data: \[DONE\]\n\n)?\Z', re.S)


SEPARATORS = [b"\n\n", b"\r\n\r\n", b"\r\r", b"\n", b""]


@st.composite
def sse_payload(draw: st.DrawFn) -> bytes:
    """SSE-ish bytes, well-formed or not: the gateway must relay them unchanged."""
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["data", "comment", "event", "binary", "done", "huge"]))
        if kind == "data":
            text = draw(st.text(max_size=30)).encode("utf-8", "surrogatepass")
            parts.append(b"data: " + text)
        elif kind == "comment":
            parts.append(b": keep-alive")
        elif kind == "event":
            parts.append(b"event: " + draw(st.sampled_from([b"error", b"", b"\xff\xfe"])))
        elif kind == "binary":
            parts.append(draw(st.binary(max_size=40)))
        elif kind == "done":
            parts.append(b"data: [DONE]")
        else:
            parts.append(b"data: " + b"z" * draw(st.sampled_from([10_000, 300_000])))
        parts.append(draw(st.sampled_from(SEPARATORS)))
    return b"".join(parts)


@dataclass
class Plan:
    script: Script
    status: int
    sse: bool
    expected: bytes  # the body a correct HTTP parser reads from the script
    clean: bool  # the answer is well-framed and ends normally


@st.composite
def upstream_plan(draw: st.DrawFn) -> Plan:
    status = draw(st.sampled_from([200, 200, 200, 200, 400, 429, 500, 503]))
    ctype = draw(
        st.sampled_from(
            [b"text/event-stream", b"text/event-stream; charset=utf-8", b"application/json", None]
        )
    )
    framing = draw(st.sampled_from(["chunked", "length", "close"]))
    fault = draw(
        st.sampled_from(
            # Stalls cost a timeout each: they are the explicit examples (STALLS) only.
            ["none", "none", "none", "cut", "cut_head", "reset", "bad_chunk", "bad_head"]
        )
    )
    payload = draw(sse_payload())
    if fault in ("cut", "reset", "stall", "bad_chunk") and len(payload) < 2:
        payload = b"data: first\n\n" + payload  # a break needs a body to break
    head = b"HTTP/1.1 %d X\r\n" % status
    if ctype is not None:
        head += b"Content-Type: " + ctype + b"\r\n"
    for i in range(draw(st.integers(0, 3))):
        head += b"X-Junk-%d: %s\r\n" % (i, draw(st.sampled_from([b"", b"a" * 500, b"\x80\xff"])))
    if fault == "bad_head":
        head = draw(
            st.sampled_from([b"HTTP/1.1 abc\r\n", b"SMTP\r\n", b"HTTP/1.1 200 OK\r\nNo colon\r\n"])
        )
    if framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        sizes = draw(st.lists(st.integers(1, 64), max_size=6))
        chunks, rest = [], payload
        for size in sizes:
            if rest:
                chunks.append(rest[:size])
                rest = rest[size:]
        if rest:
            chunks.append(rest)
        body = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks)
        if fault == "bad_chunk":
            body += b"zz\r\nzz\r\n"
        body += b"0\r\n\r\n"
    elif framing == "length":
        head += b"Content-Length: %d\r\n\r\n" % len(payload)
        body = payload
        if fault == "bad_chunk":  # the same spirit: bytes after a complete answer
            body += b"HTTP/9 junk\r\n\r\n"
    else:
        head += b"Connection: close\r\n\r\n"
        body = payload
    data = head + body
    if fault == "cut_head":
        data = data[: draw(st.integers(1, len(head) - 1))]
    elif fault in ("cut", "reset", "stall"):  # after the head and at least one body byte
        data = data[: draw(st.integers(len(head) + 1, len(data) - 1))]
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=4, unique=True)))
    bounds = [0, *[c for c in cuts if c < len(data)], len(data)]
    pieces = [
        (data[a:b], draw(st.sampled_from([0.0, 0.0, 0.01]))) for a, b in itertools.pairwise(bounds)
    ]
    end = {"cut": "close", "cut_head": "close", "reset": "reset", "stall": "stall"}.get(
        fault, "close" if framing == "close" else "keep"
    )
    clean = fault == "none" or (fault == "bad_chunk" and framing == "length")
    return Plan(
        Script(pieces, end),
        status,
        ctype is not None and ctype.startswith(b"text/event-stream"),
        payload,
        clean,
    )


def split_events(data: bytes) -> list[bytes]:
    """Whole SSE events (each with its blank line), as a client would cut them."""
    events, start = [], 0
    while (m := EVENT_END.search(data, start)) is not None:
        events.append(data[start : m.end()])
        start = m.end()
    return events


def relayed_from(relayed: bytes, expected: bytes) -> bool:
    """True when `relayed` came from the unit's `expected` body: byte for byte up to some
    point (the plain relay, plus the blank line that closes a half-sent event), or as some of
    its whole events, in order (the resumable relay passes whole events only and drops those
    it uses for itself)."""
    if expected.startswith(relayed):
        return True
    # The gateway closes an event the unit left half sent before adding its error event.
    if relayed.endswith(b"\n\n") and expected.startswith(relayed[:-2]):
        return True
    got = split_events(relayed)
    want = iter([DONE if _is_done(e) else e for e in split_events(expected)])
    return b"".join(got) == relayed and all(event in want for event in got)


def _is_done(event: bytes) -> bool:
    """An event carrying `data: [DONE]` (the resumable relay re-sends it as just that)."""
    return any(line.strip() == b"data: [DONE]" for line in event.splitlines())


# Not resumable (n > 1): the plain relay, byte for byte. Resumable: whole events only.
BODIES = {
    "plain": {
        "model": MODEL,
        "stream": True,
        "n": 2,
        "messages": [{"role": "user", "content": "x"}],
    },
    "resumable": {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}]},
}


_CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
# Explicit examples: a unit that stalls mid-stream, and one that stalls inside its head.
STALLS = [
    Plan(
        Script([(_CHUNKED + b"b\r\ndata: one\n\n\r\n", 0.0)], "stall"),
        200,
        True,
        b"data: one\n\ndata: two\n\n",
        clean=False,
    ),
    Plan(Script([(_CHUNKED[:20], 0.0)], "stall"), 200, True, b"data: one\n\n", clean=False),
]


@pytest.mark.parametrize("mode", ["plain", "resumable"])
def test_malformed_upstream_answers(
    gw: GatewayProcess, raw_unit: RawUnit, control: Control, mode: str
) -> None:
    ids = itertools.count()
    seen: Counter[str] = Counter()
    body = orjson.dumps(BODIES[mode])

    @settings(HTTP_FUZZ, max_examples=40)
    @example(plan=STALLS[0])
    @example(plan=STALLS[1])
    @given(plan=upstream_plan())
    def run(plan: Plan) -> None:
        rid = f"{mode}{next(ids)}"
        raw_unit.expect(rid, plan.script)
        reply = post(gw.port, body, session=gw.sessions["raw"], request_id=rid, deadline=DEADLINE)
        assert reply.status is not None and reply.complete, "the gateway must always answer"
        assert reply.status != 500, reply.body[:300]
        assert reply.headers["x-unitgate-unit"] == "raw"
        if reply.status in (502, 504):
            check_error(reply)
            seen[f"{reply.status} {reply.json()['error']['code']}"] += 1
            assert not plan.clean or plan.status >= 500, (plan, reply)
            return
        assert reply.status == plan.status
        got = reply.body
        if ERROR_TAIL.search(got):  # the gateway ended the stream with an error event
            relayed, _, event = got.removesuffix(DONE).rpartition(ERROR_EVENT)
            assert event.endswith(b"}\n\n"), got[-300:]
            assert relayed_from(relayed, plan.expected), (relayed[-200:], plan)
            seen["error event " + orjson.loads(b'{"error":' + event)["error"]["code"]] += 1
            if mode == "plain":
                assert not plan.clean, "a clean answer ended with an error event"
        elif plan.clean and mode == "plain":
            assert got == plan.expected, (got[-200:], plan.expected[-200:])
            seen[f"relayed {plan.status}"] += 1
        else:
            # A close-delimited body that ends early is indistinguishable from a short one.
            assert relayed_from(got, plan.expected), (got[-200:], plan)
            seen[f"relayed {plan.status}" if plan.clean else "relayed a part"] += 1

    with control():
        run()
    print(mode, seen)
    # The examples must have reached every kind of ending, or the test proves little.
    assert seen["relayed 200"] and any(k.startswith("502") for k in seen), seen
    assert seen["error event idle_timeout"] and seen["504 first_byte_timeout"], seen
