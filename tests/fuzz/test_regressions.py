"""Bugs the fuzz tests found, each pinned by one deterministic example over real sockets."""

from __future__ import annotations

import gzip

import orjson
import pytest

from tests.fuzz.harness import GatewayProcess, RawUnit, Script, exchange, post, post_head
from tests.support import MODEL

pytestmark = pytest.mark.both_relays

# n > 1 is never resumed: the plain relay, which passes the unit's bytes unchanged.
STREAM = orjson.dumps(
    {"model": MODEL, "stream": True, "n": 2, "messages": [{"role": "user", "content": "x"}]}
)
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


def test_undecodable_content_encoding_is_400_not_500(gw: GatewayProcess) -> None:
    # Was: aiohttp's RequestPayloadError escaped the handler, a 500 and a logged traceback.
    for coding, body in [(b"gzip", b"\x00\x00"), (b"deflate", b"not deflate at all")]:
        head = post_head(
            len(body), session=gw.sessions["u0"], extra=b"Content-Encoding: %s\r\n" % coding
        )
        reply = exchange(gw.port, [(head + body, 0.0)])
        assert reply.status == 400, reply.body
        assert "could not be read" in reply.json()["error"]["message"]
    # A well-formed compressed body is still accepted.
    body = gzip.compress(
        orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    )
    head = post_head(len(body), session=gw.sessions["u0"], extra=b"Content-Encoding: gzip\r\n")
    assert exchange(gw.port, [(head + body, 0.0)]).status == 200


def test_array_prompt_with_multibyte_text_is_accepted(gw: GatewayProcess) -> None:
    # Was: the affinity prefix cut the prompt's JSON inside a character: UnicodeDecodeError, 500.
    body = orjson.dumps({"model": MODEL, "prompt": ["a" + "\u00e9" * 300], "max_tokens": 2})
    head = post_head(len(body), session=gw.sessions["u0"]).replace(
        b"/chat/completions", b"/completions"
    )
    reply = exchange(gw.port, [(head + body, 0.0)])
    assert reply.status == 200, reply.body


def test_interim_1xx_from_a_unit_is_skipped(gw: GatewayProcess, raw_unit: RawUnit) -> None:
    # Was: "100 Continue" counted as the whole answer; the client got a bare 100 and hung.
    raw_unit.expect(
        "interim",
        Script(
            [
                (
                    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
                    0.01,
                ),
                (SSE_HEAD + b"Connection: close\r\n\r\ndata: one\n\n", 0.0),
            ],
            "close",
        ),
    )
    reply = post(gw.port, STREAM, session=gw.sessions["raw"], request_id="interim", deadline=5)
    assert reply.status == 200 and reply.complete
    assert reply.body == b"data: one\n\n"


def test_reset_ends_a_close_delimited_stream_with_an_error(
    gw: GatewayProcess, raw_unit: RawUnit
) -> None:
    # Was: a reset counted as the orderly close that ends a close-delimited body: a truncated
    # stream relayed as complete, with no error event.
    pieces = [(SSE_HEAD + b"Connection: close\r\n\r\ndata: one\n\n", 0.05), (b"data: tw", 0.05)]
    raw_unit.expect("rst", Script(pieces, "reset"))
    reply = post(gw.port, STREAM, session=gw.sessions["raw"], request_id="rst", deadline=5)
    assert reply.status == 200 and reply.complete
    assert reply.body.startswith(b"data: one\n\ndata: tw")
    assert b'"code":"reset"' in reply.body


def test_error_event_after_a_partial_event_is_its_own_event(
    gw: GatewayProcess, raw_unit: RawUnit
) -> None:
    pieces = [(SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n", 0.0)]
    pieces += [(b"b\r\ndata: one\n\n\r\n", 0.05), (b"8\r\ndata: tw\r\n", 0.05)]
    raw_unit.expect("partial", Script(pieces, "close"))
    reply = post(gw.port, STREAM, session=gw.sessions["raw"], request_id="partial", deadline=5)
    events = reply.body.replace(b"\r\n", b"\n").split(b"\n\n")
    assert any(e.startswith(b'data: {"error":') for e in events), reply.body


def test_junk_right_after_a_complete_answer_does_not_swallow_its_end(
    gw: GatewayProcess, raw_unit: RawUnit
) -> None:
    # Was: a parse error on junk that followed the answer's last bytes in the same read dropped
    # those bytes and the completion; the stream hung until the `total` timeout (600 s default)
    # and then ended with a total_timeout error event.
    head = SSE_HEAD + b"Content-Length: 13\r\n\r\n"
    raw_unit.expect(
        "junk", Script([(head + b"d", 0.05), (b"ata: first\n\nHTTP/9 junk\r\n\r\n", 0.0)], "keep")
    )
    reply = post(gw.port, STREAM, session=gw.sessions["raw"], request_id="junk", deadline=3)
    assert reply.status == 200 and reply.complete
    assert reply.body == b"data: first\n\n"
    assert reply.elapsed < 1.0
