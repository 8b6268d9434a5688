"""Small network facts shared by the admin API, the local cluster launcher, and the two sides
of the relay (HTTP heads from clients and from units)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; names other than localhost are not resolved."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Listen backlog of every server here (the kernel caps it at net.core.somaxconn, 4096 on
# current kernels). aiohttp's default of 128 overflows when thousands of streams arrive at
# once: the kernel then drops SYNs, and clients see connects time out while the server idles.
LISTEN_BACKLOG = 4096

# Seconds an idle client connection is kept open between requests (aiohttp's default).
KEEPALIVE_S = 75.0


# The chunked transfer coding's last chunk, with no trailer: a streamed answer's end.
LAST_CHUNK = b"0\r\n\r\n"


def head_end(buf: bytes) -> int:
    """The index just past an HTTP head's blank line, or -1 when it has not come yet. Lines
    may end in a bare LF; `buf[end - 4:end] != b"\r\n\r\n"` tells such a head."""
    crlf, lf = buf.find(b"\r\n\r\n"), buf.find(b"\n\n")
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf + 4
    return -1 if lf < 0 else lf + 2


def http_address(url: str) -> tuple[str, int | None]:
    """The host and port (None: not given) of a plain `http://HOST[:PORT]` URL, the form a
    simulated node listens at; ValueError saying what else it is. The simulator and the
    launcher that plans it read addresses by this one rule, each saying it its own way."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in {url!r}") from exc
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{url!r} is not an http://host:port URL")
    return parts.hostname, port
