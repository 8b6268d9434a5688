"""Probing a node over raw connections: the I/O every unit kind's probe is built from.

A thousand units of four nodes probed every second is 4,000 requests a second; aiohttp's
client would spend most of a core on them. A dedicated `ConnectionPool` (the request path's
raw keep-alive client) with a prebuilt request head keeps a probe to a write and a parse.
Every call runs under its own deadline, and a timed-out or cancelled exchange closes its
connection (the pool discards what did not end cleanly), so a late answer can never be read
as the answer to the next probe. What an answer means is each kind's business (kinds/).
"""

from __future__ import annotations

import asyncio
import ssl
import time

import orjson

from gateway.health.lookout import LIMIT, Lookout, Sent
from gateway.health.result import NodeReport
from gateway.upstream.connection import ConnectionBroken
from gateway.upstream.pool import ConnectionPool, Endpoint
from gateway.upstream.request import request_head


class Target:
    """A node's address and one GET's request head, built once rather than on every probe.
    `extra` is the unit's own header lines (its API key, its `headers`); `tls` its https
    settings (gateway/tls.py), the same the request path uses."""

    __slots__ = ("endpoint", "head", "path")

    def __init__(
        self,
        url: str,
        path: str = "/health",
        extra: bytes = b"",
        accept: str = "application/json",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.endpoint = Endpoint(url.rstrip("/"), tls)
        self.path = path
        host = self.endpoint.host_header.decode()
        self.head = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: {accept}\r\n".encode("latin-1")
            + extra
            + b"\r\n"
        )


def probe_pool(timeout: float, keepalive: float) -> ConnectionPool:
    """The probers' connections. A probe bounds its connect with its own deadline, which a
    pending connect may outlast by a look (lookout.py): the pool's bound is a last resort."""
    return ConnectionPool(LIMIT * timeout, keepalive, 0)


class ProbeFailed(Exception):
    """A GET that got no answer: the report says why (a timeout is the soft kind)."""

    def __init__(self, report: NodeReport) -> None:
        super().__init__(report.error)
        self.report = report


async def get(pool: ConnectionPool, target: Target, within: float) -> tuple[int, bytes, float]:
    """Status, body and milliseconds taken; the node has `within` seconds to answer once the
    request went out, judged at the deadline by what its socket shows: an answer that came in
    time is read though the gateway was too busy to look (lookout.py). Raises ProbeFailed
    when no answer came. Timed by perf_counter: uvloop's loop.time() is libuv's cached
    millisecond clock, which reads a quick local answer as 0 ms."""
    start = time.perf_counter()
    loop = asyncio.get_running_loop()
    sent = Sent()
    try:
        async with asyncio.timeout(within) as deadline:
            lookout = Lookout(deadline, loop, sent)
            try:
                status, body = await exchange(pool, target.endpoint, target.head, b"", sent)
            finally:
                lookout.cancel()
    except TimeoutError:
        report = NodeReport(None, f"no answer within {within * 1000:.0f} ms", timed_out=True)
        raise ProbeFailed(report) from None
    except OSError as exc:
        raise ProbeFailed(NodeReport(None, describe(exc))) from None
    return status, body, (time.perf_counter() - start) * 1000


async def canary(
    pool: ConnectionPool, endpoint: Endpoint, model: str, within: float, extra: bytes = b""
) -> str | None:
    """A 1-token completion on the leader; returns why it failed, or None when it worked.

    Catches what `/health` cannot: a leader that answers probes but cannot generate.
    """
    body = orjson.dumps({"model": model, "prompt": "ping", "max_tokens": 1})
    head = request_head(endpoint, "/v1/completions", len(body), "unitgate-canary", None, extra)
    try:
        async with asyncio.timeout(within):
            status, answer = await exchange(pool, endpoint, head, body)
    except TimeoutError:
        return f"no answer within {within:g} s"
    except OSError as exc:
        return describe(exc)
    if status != 200:
        return f"HTTP {status}: {answer[:200].decode('utf-8', 'replace')}"
    return None


async def exchange(
    pool: ConnectionPool, endpoint: Endpoint, head: bytes, body: bytes, sent: Sent | None = None
) -> tuple[int, bytes]:
    """One request and its whole answer; the caller bounds it with a deadline. `sent` hears
    when the request went out, and on which connection.

    A pooled connection the node closed while idle fails before any answer: that says
    nothing about the node, so the request is sent once more on a fresh connection.
    """
    while True:
        conn = await pool.acquire(endpoint)
        pooled = conn.idle_since > 0.0  # set when a connection goes back to the pool
        try:
            conn.send(head, body)
            if sent is not None:
                sent.went_out(conn, conn.loop.time())
            await conn.wait_for(lambda: conn.complete)  # noqa: B023 - awaited in this pass
            return conn.status, b"".join(conn.body)
        except ConnectionBroken:
            if not pooled or conn.head_done:
                raise
        finally:
            pool.release(endpoint, conn)  # closes it unless the answer ended cleanly


def describe(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: the node's certificate is not trusted: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, ConnectionBroken):
        return str(exc).replace("the unit", "the node")
    return exc.strerror or str(exc) or type(exc).__name__
