"""A request head as the lean front reads it, and whether the lean front serves it.

The lean front serves only what it understands fully: an HTTP/1.1 POST to one of its routes
with a `Content-Length` body, no transfer or content coding, no upgrade, no expectation but
`100-continue`, a head that llhttp (httptools) parses strictly, within MAX_HEAD bytes and
aiohttp's limits on its parts. Anything
else is handed to aiohttp with the bytes read so far, and answered exactly as before.
"""

from __future__ import annotations

from collections.abc import Container
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


def read_head(head: bytes, routes: Container[bytes], cors: bool) -> Head | None:
    """`head` (ending in its blank line) as the lean front serves it, or None: aiohttp's."""
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
    length: int | None = None
    expect_continue = False
    headers: CIMultiDict[str] = CIMultiDict()
    for raw_name, raw_value in fields.fields:
        if len(raw_name) > MAX_LINE or len(raw_value) > MAX_LINE:
            return None
        name = raw_name.lower()
        if name == b"content-length":
            length = int(raw_value)  # llhttp has checked: digits, and only one
        elif name in (b"transfer-encoding", b"upgrade"):
            return None
        elif name == b"content-encoding":
            if raw_value.strip().lower() != b"identity":
                return None
        elif name == b"expect":
            if raw_value.strip().lower() != b"100-continue":
                return None
            expect_continue = True
        elif name == b"origin" and cors:
            return None  # its CORS headers are aiohttp's to add
        headers.add(
            raw_name.decode("utf-8", "surrogateescape"),
            raw_value.decode("utf-8", "surrogateescape"),
        )
    if length is None:
        return None
    return Head(path, headers, length, parser.should_keep_alive(), expect_continue)
