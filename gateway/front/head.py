"""A request head as the lean front reads it, and whether the lean front serves it.

The lean front serves only what it understands fully: an HTTP/1.1 POST to one of its routes
with a `Content-Length` body, no transfer or content coding, no upgrade, no expectation but
`100-continue`, a head that llhttp (httptools) parses strictly, within MAX_HEAD bytes and
aiohttp's limits on its parts, with none of the fields aiohttp takes once only given twice.
Anything else is handed to aiohttp with the bytes read so far, and answered exactly as before.
A field's value is read as aiohttp reads it: without the whitespace around it.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass

import httptools
from multidict import CIMultiDict

MAX_HEAD = 16 * 1024  # a longer head is aiohttp's to refuse (its limits, its answer)
# aiohttp's own limits on a head's parts: past them it answers 400, so past them the lean
# front hands the request over for that answer.
MAX_LINE = 8190  # the request target, a header's name or value
MAX_FIELDS = 128


@dataclass(frozen=True, slots=True)
class Head:
    path: bytes  # without the query
    headers: CIMultiDict[str]
    length: int  # of the body
    keep_alive: bool
    expect_continue: bool


# Fields aiohttp takes once only (RFC 9110's singletons): a second one is its 400.
SINGLETONS = frozenset(
    (
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"host",
        b"max-forwards",
        b"server",
        b"transfer-encoding",
        b"user-agent",
    )
)
_OWS = b" \t"  # llhttp strips it before a field's value, aiohttp after it too


class _Fields:
    """httptools' callbacks for one head: the target and the header fields."""

    __slots__ = ("fields", "url")

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))


# The native relay's request_head (relay/native/heads.c): a head of the common shape read in
# one compiled call, as (path, fields, length, keep_alive); None leaves it to read_head's Python.
QuickHead = Callable[[bytes], tuple[bytes, list[tuple[str, str]], int, bool] | None]


def read_head(
    head: bytes, routes: Container[bytes], cors: bool, quick: QuickHead | None = None
) -> Head | None:
    """`head` (ending in its blank line) as the lean front serves it, or None: aiohttp's.
    `quick` reads the heads of the common shape first (it takes none with an Origin, an
    Expect or a coding, so CORS and `100-continue` stay this function's)."""
    if quick is not None and (taken := quick(head)) is not None:
        target, pairs, length, keep_alive = taken
        if target not in routes:
            return None
        return Head(target, CIMultiDict(pairs), length, keep_alive, False)
    if not head.endswith(b"\r\n\r\n"):
        return None  # lines ending in a bare LF: lenient parsing is aiohttp's to do
    fields = _Fields()
    parser = httptools.HttpRequestParser(fields)
    try:
        parser.feed_data(head)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None  # aiohttp parses it again and answers it its own way
    if parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
        return None
    path = fields.url.split(b"?", 1)[0]
    if path not in routes or len(fields.url) > MAX_LINE or len(fields.fields) > MAX_FIELDS:
        return None
    return _with_fields(head, path, fields.fields, parser.should_keep_alive(), cors)


# A request with one of these fields is aiohttp's to serve; one with these codings, only with
# the value named (compared without case).
_REFUSED = frozenset((b"transfer-encoding", b"upgrade"))
_CODED = ((b"content-encoding", b"identity"), (b"expect", b"100-continue"))


def _with_fields(
    head: bytes, path: bytes, fields: list[tuple[bytes, bytes]], keep_alive: bool, cors: bool
) -> Head | None:
    """The head's fields, read once as a whole: the checks are set operations over the
    lower-cased names, and a field is looked at alone only when its name asks for it."""
    names = [name.lower() for name, _ in fields]
    seen = set(names)
    if b"content-length" not in seen or not seen.isdisjoint(_REFUSED):
        return None
    if cors and b"origin" in seen:
        return None  # with CORS on, its headers are aiohttp's to add
    if len(seen) != len(names) and any(names.count(name) > 1 for name in SINGLETONS & seen):
        return None
    if len(head) > MAX_LINE and any(
        len(name) > MAX_LINE or len(value) > MAX_LINE for name, value in fields
    ):
        return None
    if b" \r\n" in head or b"\t\r\n" in head:  # llhttp keeps whitespace after a value
        fields = [(name, value.rstrip(_OWS)) for name, value in fields]
    for coded, served in _CODED:
        if coded in seen and any(
            n == coded and v.lower() != served for n, (_, v) in zip(names, fields, strict=True)
        ):
            return None
    length = int(fields[names.index(b"content-length")][1])  # llhttp has checked: digits
    headers: CIMultiDict[str] = CIMultiDict(
        [
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
            for name, value in fields
        ]
    )
    return Head(path, headers, length, keep_alive, b"expect" in seen)
