"""The native relay's head readers (relay/native/heads.c) against the Python ones they stand in
for: a request head they take is what the lean front's read_head makes of it (httptools and
head.py), a response head what httptools and the upstream connection make of it; a head of
another shape they leave (None) to those. Generated heads mix the shapes clients and units send
with the ones the readers must leave: other methods and versions, codings, folded and bare-LF
lines, duplicates, control and non-ASCII bytes, whitespace around names and values."""

from __future__ import annotations

from typing import Any

import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.front.head import read_head
from gateway.relay import native
from gateway.upstream.connection import _HEADERS_READ

try:
    NATIVE: Any = native.module()
except native.NativeUnavailable as exc:  # no compiler here: nothing to hold to the reference
    pytest.skip(f"the native relay is not built: {exc}", allow_module_level=True)

ROUTE = b"/v1/chat/completions"

# Heads as clients send them: each must be taken (else the compiled reader is never used).
CLIENT_HEADS = [
    # aiohttp's client (the load generator, the tests)
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept: */*\r\n"
    b"Accept-Encoding: gzip, deflate\r\nUser-Agent: Python/3.11 aiohttp/3.10.5\r\n"
    b"Content-Length: 120\r\nContent-Type: application/json\r\n\r\n",
    # the openai SDK (httpx)
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nAccept: application/json\r\n"
    b"Content-Type: application/json\r\nUser-Agent: OpenAI/Python 1.99.9\r\n"
    b"X-Stainless-Lang: python\r\nX-Stainless-Retry-Count: 0\r\n"
    b"Authorization: Bearer sk-unitgate-abc\r\nContent-Length: 98\r\n\r\n",
    # curl
    b"POST /v1/completions HTTP/1.1\r\nHost: localhost:8000\r\nUser-Agent: curl/7.88.1\r\n"
    b"Accept: */*\r\nContent-Type: application/json\r\nContent-Length: 61\r\n\r\n",
]

# Response heads as units send them: uvicorn (vLLM), aiohttp (the builtin engine, simulator).
UNIT_HEADS = [
    b"HTTP/1.1 200 OK\r\ndate: Sun, 06 Dec 2026 12:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Date: Sun, 06 Dec 2026 12:00:00 GMT\r\nServer: Python/3.11 aiohttp/3.10.5\r\n\r\n",
    b"HTTP/1.1 400 Bad Request\r\ndate: Sun, 06 Dec 2026 12:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-length: 143\r\ncontent-type: application/json\r\n\r\n",
]


def python_request(head: bytes) -> tuple[Any, ...] | None:
    read = read_head(head, {ROUTE, b"/v1/completions", b"/x"}, cors=False)
    if read is None:
        return None
    return read.path, list(read.headers.items()), read.length, read.keep_alive
    # (expect_continue is never set on a head the compiled reader takes: it leaves Expect)


def native_request(head: bytes) -> tuple[Any, ...] | None:
    quick = read_head(
        head, {ROUTE, b"/v1/completions", b"/x"}, cors=False, quick=NATIVE.request_head
    )
    if NATIVE.request_head(head) is None:
        return None
    assert quick is not None and not quick.expect_continue
    return quick.path, list(quick.headers.items()), quick.length, quick.keep_alive


class _Reference:
    """The upstream connection's httptools callbacks, as connection.py keeps a head."""

    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in _HEADERS_READ:
            self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.done = True


def python_response(head: bytes) -> tuple[Any, ...] | None:
    ref = _Reference()
    parser = httptools.HttpResponseParser(ref)
    try:
        parser.feed_data(head)
    except httptools.HttpParserError:
        return None
    if not ref.done:
        return None
    return parser.get_status_code(), ref.headers, parser.should_keep_alive()


@pytest.mark.parametrize("head", CLIENT_HEADS)
def test_the_heads_clients_send_are_taken_as_python_reads_them(head: bytes) -> None:
    taken = native_request(head)
    assert taken is not None
    assert taken == python_request(head)


@pytest.mark.parametrize("head", UNIT_HEADS)
def test_the_heads_units_send_are_taken_as_httptools_reads_them(head: bytes) -> None:
    taken = NATIVE.response_head(head + b"data: x", len(head))
    assert taken is not None
    assert taken == python_response(head)


# Each part of a generated head is plain, else (one time in ODDS) odd: most heads are then of
# the common shape, and each odd part appears in many of them.
ODDS = 20
PLAIN_NAMES = [b"Host", b"Content-Type", b"User-Agent", b"X-Request-Id", b"x-a", b"Accept"]
ODD_NAMES = [
    b"Content-Length",
    b"content-length",
    b"Connection",
    b"Expect",
    b"Transfer-Encoding",
    b"Upgrade",
    b"Origin",
    b"Content-Encoding",
    b"ETag",
    b"Bad Name",
    b"B\xc3\xa4d",
    b"",
    b"X:Y",
    b"HOST",
    b"Content-type",
]
PLAIN_VALUES = [b"12", b"application/json", b"a b", b"*/*", b"Bearer sk-1", b"a\tb", b""]
ODD_VALUES = [
    b"0",
    b"007",
    b"-1",
    b"1 2",
    b"99999999999999999999",
    b"keep-alive",
    b"Close",
    b"close",
    b"upgrade",
    b"chunked",
    b"gzip",
    b"identity",
    b"100-continue",
    b" ",
    b"\xc3\xa9",
    b"a\x01b",
    b"a\x7fb",
    b"  padded  ",
    b"x\t",
    b"x ",
]
ODD_LEADS = [b"", b"  ", b"\t", b" \t"]
ODD_SEPARATORS = [b" :", b"::"]
ODD_ENDS = [b"\n", b"\r\n ", b"\r\n\t"]  # a bare LF; a folded line follows
PLAIN_REQUEST_LINES = [b"POST /v1/chat/completions HTTP/1.1", b"POST /x?a=b&c=%20 HTTP/1.1"]
ODD_REQUEST_LINES = [
    b"POST /x HTTP/1.0",
    b"GET /x HTTP/1.1",
    b"POST  /x HTTP/1.1",
    b"POST /x#f HTTP/1.1",
    b"POST http://h/x HTTP/1.1",
    b'POST /x"y HTTP/1.1',
    b"POST /x\xc3\xa9 HTTP/1.1",
    b"post /x HTTP/1.1",
    b"POST /x HTTP/1.1 ",
]
PLAIN_STATUS_LINES = [b"HTTP/1.1 200 OK", b"HTTP/1.1 500 Internal Server Error"]
ODD_STATUS_LINES = [
    b"HTTP/1.1 100 Continue",
    b"HTTP/1.1 200",
    b"HTTP/1.1 200 ",
    b"HTTP/1.0 200 OK",
    b"HTTP/1.1 99 OK",
    b"HTTP/1.1 600 X",
    b"HTTP/1.1 2000 OK",
    b"HTTP/1.1 204 No Content",
    b"HTTP/1.1 200 \xc3\xa9",
    b"HTTP/1.1  200 OK",
]


def part(draw: st.DrawFn, plain: list[bytes], odd: list[bytes]) -> bytes:
    """A plain part, or one time in ODDS an odd one."""
    if draw(st.integers(0, ODDS - 1)):
        return draw(st.sampled_from(plain))
    return draw(st.sampled_from(odd))


@st.composite
def fields(draw: st.DrawFn, framing: bytes) -> bytes:
    """Field lines, usually with one framing field (`framing`: its name and value)."""
    out = []
    for _ in range(draw(st.integers(0, 6))):
        name = part(draw, PLAIN_NAMES, ODD_NAMES)
        sep = part(draw, [b":"], ODD_SEPARATORS)
        lead = part(draw, [b" "], ODD_LEADS)
        value = part(draw, PLAIN_VALUES, ODD_VALUES)
        out.append(name + sep + lead + value + part(draw, [b"\r\n"], ODD_ENDS))
    if draw(st.integers(0, ODDS - 1)):
        out.insert(draw(st.integers(0, len(out))), framing + b"\r\n")
    return b"".join(out)


@st.composite
def request_heads(draw: st.DrawFn) -> bytes:
    length = draw(st.sampled_from([b"12", b"0", b"4096"]))
    body = draw(fields(b"Content-Length: " + length))
    return part(draw, PLAIN_REQUEST_LINES, ODD_REQUEST_LINES) + b"\r\n" + body + b"\r\n"


@st.composite
def response_heads(draw: st.DrawFn) -> bytes:
    framing = draw(st.sampled_from([b"Content-Length: 12", b"transfer-encoding: chunked"]))
    body = draw(fields(framing))
    return part(draw, PLAIN_STATUS_LINES, ODD_STATUS_LINES) + b"\r\n" + body + b"\r\n"


SETTINGS = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(request_heads())
def test_a_request_head_taken_is_read_as_python_reads_it(head: bytes) -> None:
    taken = native_request(head)
    if taken is not None:
        assert taken == python_request(head)


@SETTINGS
@given(response_heads())
def test_a_response_head_taken_is_read_as_httptools_reads_it(head: bytes) -> None:
    taken = NATIVE.response_head(head + b"0\r\n", len(head))
    if taken is not None:
        assert taken == python_response(head)


def test_generated_heads_of_the_common_shape_are_taken() -> None:
    """The generators above make heads the readers take, so the tests above compare something:
    a plain head with each name and plain value is taken."""
    for name in (b"Host", b"X-Request-Id", b"Authorization", b"Content-Type", b"User-Agent"):
        head = b"POST /x HTTP/1.1\r\n" + name + b": a b\r\nContent-Length: 12\r\n\r\n"
        assert native_request(head) is not None, head
        response = b"HTTP/1.1 200 OK\r\n" + name + b": a\r\nContent-Length: 12\r\n\r\n"
        assert NATIVE.response_head(response, len(response)) is not None, response


@pytest.mark.parametrize(
    "head",
    [
        b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
        b"POST /x HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 1\r\n\r\n",
        b"POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
        b"POST /x HTTP/1.1\r\nOrigin: http://a\r\nContent-Length: 1\r\n\r\n",
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /x HTTP/1.1\r\nConnection: upgrade\r\nContent-Length: 1\r\n\r\n",
        b"POST /x HTTP/1.1\r\nX: \xc3\xa9\r\nContent-Length: 1\r\n\r\n",
        b"POST /x HTTP/1.1\r\nX: a\r\n b\r\nContent-Length: 1\r\n\r\n",
        b"POST /x HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST /x HTTP/1.1\nContent-Length: 1\r\n\r\n",
    ],
)
def test_a_request_head_of_another_shape_is_left_to_python(head: bytes) -> None:
    assert NATIVE.request_head(head) is None


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n",  # framed by the close
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: a \r\nContent-Length: 1\r\n\r\n",
    ],
)
def test_a_response_head_of_another_shape_is_left_to_httptools(head: bytes) -> None:
    assert NATIVE.response_head(head, len(head)) is None
