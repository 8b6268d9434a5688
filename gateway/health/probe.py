"""Probing one node's `/health` (and the optional canary completion) over raw connections.

A thousand units of four nodes probed every second is 4,000 requests a second; aiohttp's
client would spend most of a core on them. A dedicated `ConnectionPool` (the request path's
raw keep-alive client) with a prebuilt request head keeps a probe to a write, a parse and a
JSON decode. Every call runs under its own deadline, and a timed-out or cancelled exchange
closes its connection (the pool discards what did not end cleanly), so a late answer can
never be read as the answer to the next probe.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.health.result import NodeReport
from gateway.proxy.connection import ConnectionBroken, ConnectionPool, Endpoint
from gateway.proxy.upstream import request_head


class Target:
    """A node's address and its request head, built once rather than on every probe."""

    __slots__ = ("endpoint", "head")

    def __init__(self, url: str, path: str = "/health") -> None:
        self.endpoint = Endpoint(url.rstrip("/"))
        host = self.endpoint.host_header.decode()
        self.head = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n\r\n"
        ).encode("latin-1")


async def probe_node(pool: ConnectionPool, target: Target, within: float) -> NodeReport:
    """`within` seconds bound the whole probe, connecting included."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        async with asyncio.timeout(within):
            status, body = await exchange(pool, target.endpoint, target.head, b"")
    except TimeoutError:
        return NodeReport(None, f"no answer within {within * 1000:.0f} ms", timed_out=True)
    except OSError as exc:
        return NodeReport(None, describe(exc))
    return parse_health(status, body, (loop.time() - start) * 1000)


async def canary(pool: ConnectionPool, endpoint: Endpoint, model: str, within: float) -> str | None:
    """A 1-token completion on the leader; returns why it failed, or None when it worked.

    Catches what `/health` cannot: a leader that answers probes but cannot generate.
    """
    body = orjson.dumps({"model": model, "prompt": "ping", "max_tokens": 1})
    head = request_head(endpoint, "/v1/completions", len(body), "unitgate-canary", None)
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
    pool: ConnectionPool, endpoint: Endpoint, head: bytes, body: bytes
) -> tuple[int, bytes]:
    """One request and its whole answer; the caller bounds it with a deadline.

    A pooled connection the node closed while idle fails before any answer: that says
    nothing about the node, so the request is sent once more on a fresh connection.
    """
    while True:
        conn = await pool.acquire(endpoint)
        pooled = conn.idle_since > 0.0  # set when a connection goes back to the pool
        try:
            conn.send(head, body)
            await conn.wait_for(lambda: conn.complete)  # noqa: B023 - awaited in this pass
            return conn.status, b"".join(conn.body)
        except ConnectionBroken:
            if not pooled or conn.head_done:
                raise
        finally:
            pool.release(endpoint, conn)  # closes it unless the answer ended cleanly


def parse_health(status: int, body: bytes, latency_ms: float) -> NodeReport:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return NodeReport(latency_ms, f"HTTP {status} without a JSON object body")
    said = _text(doc, "status")
    error = None
    if status != 200:
        error = f"HTTP {status}" + (f" (status {said})" if said else "")
    return NodeReport(
        latency_ms,
        error,
        said,
        _text(doc, "unit"),
        _text(doc, "role"),
        _int(doc, "rank"),
        _int(doc, "pid"),
        _int(doc, "step"),
        _int(doc, "pending"),
        _int(doc, "kv_slots_used"),
    )


def describe(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionBroken):
        return str(exc).replace("the unit", "the node")
    return exc.strerror or str(exc) or type(exc).__name__


def _text(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    return value if isinstance(value, str) else None


def _int(doc: dict[str, Any], key: str) -> int | None:
    value = doc.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
