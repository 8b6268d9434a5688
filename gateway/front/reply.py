"""The bytes of the lean front's answers: a streamed answer's head, a whole answer."""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus

from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE

_REASONS = {s.value: s.phrase for s in HTTPStatus}
# Set here, whatever a response's own headers say.
_OWN = frozenset(("content-length", "transfer-encoding", "connection", "date", "server"))
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _head(
    status: int, reason: str, headers: Iterable[tuple[str, str]], framing: str, keep_alive: bool
) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    for name, value in headers:
        if name.lower() in _OWN:
            continue
        if "\r" in value or "\n" in value:
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    lines.append(framing)
    lines.append(f"Date: {rfc822_formatted_time()}")  # aiohttp's, formatted once a second
    lines.append(f"Server: {SERVER_SOFTWARE}")
    if not keep_alive:
        lines.append("Connection: close")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


def stream_head(status: int, headers: Iterable[tuple[str, str]], keep_alive: bool) -> bytes:
    """A streamed answer's head: its chunks follow."""
    reason = _REASONS.get(status, "")
    return _head(status, reason, headers, "Transfer-Encoding: chunked", keep_alive)


def whole(response: web.StreamResponse, keep_alive: bool) -> bytes:
    """A whole answer (a `web.Response` with a body of bytes), head and body."""
    if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
        raise TypeError(f"the lean front sends only whole answers of bytes, not {response!r}")
    body = response.body
    framing = f"Content-Length: {len(body)}"
    head = _head(response.status, response.reason, response.headers.items(), framing, keep_alive)
    return head + body


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of the chunked transfer coding."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def server_error(keep_alive: bool) -> bytes:
    """What aiohttp answers when a handler raised."""
    body = b"500 Internal Server Error\n\nServer got itself in trouble"
    headers = [("Content-Type", "text/plain; charset=utf-8")]
    head = _head(500, "Internal Server Error", headers, f"Content-Length: {len(body)}", keep_alive)
    return head + body
