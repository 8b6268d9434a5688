"""Keep-alive connections to leaders, kept idle per leader between answers.

`ConnectionPool` keeps idle connections per leader (LIFO, so a few warm connections serve a
light load and the rest expire), optionally bounds how many are open in total, and connects
new ones under a connect timeout that a lagging event loop stretches (stretch.py). An
`Endpoint` is a node's address, parsed once.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gateway.tls import client_context
from gateway.upstream.connection import UpstreamConnection, connection_of, tapped
from gateway.upstream.stretch import LagTotal, Stretch

if TYPE_CHECKING:
    from gateway.relay.native import Relay


class Endpoint:
    """A node's address, parsed once. An https:// one connects with `tls` (the unit's CA and
    client certificate, gateway/tls.py), or by default verifying with the system's trust store."""

    __slots__ = ("host", "host_header", "key", "port", "ssl")

    def __init__(self, base_url: str, tls: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        https = parts.scheme == "https"
        self.ssl = (tls or client_context()) if https else None
        self.port = parts.port or (443 if https else 80)
        self.host_header = parts.netloc.encode()
        # Idle connections are kept per key: one made with other TLS settings is not reused.
        self.key = (self.host, self.port, self.ssl)


class ConnectionPool:
    """Idle keep-alive connections per leader, bounded in age and (optionally) in total."""

    def __init__(
        self,
        connect_timeout: float,
        keepalive_timeout: float,
        limit: int,
        lag: LagTotal | None = None,
        native: Relay | None = None,
    ) -> None:
        """`native` is the compiled relay (gateway/relay/native) its connections read bodies with.
        A connect timeout is measured in the loop's responsive time: what the loop spent
        behind schedule while the connect was out is added to its deadline (a kernel-finished
        connect must not time out because the loop ran its timers first), read from `lag`
        (stretch.py). With none the connect's deadline is a plain one: the probers' pool,
        whose probes bound their connects with their own deadlines (health/lookout.py)."""
        self.lag = lag
        self.native = native
        self.connect_timeout = connect_timeout
        self.keepalive_timeout = keepalive_timeout
        self._idle: dict[tuple[str, int, ssl.SSLContext | None], list[UpstreamConnection]] = {}
        self._limit = asyncio.Semaphore(limit) if limit > 0 else None
        self._all: set[UpstreamConnection] = set()

    async def reserve(self) -> None:
        """Wait for one of the `limit` connection slots (at once without a limit); the next
        `acquire(reserved=True)` uses it. Apart from `acquire` so that a caller can tell the
        gateway's own wait from the unit's connect."""
        if self._limit is not None:
            await self._limit.acquire()

    async def take(self, endpoint: Endpoint) -> UpstreamConnection | None:
        """A slot and a fresh idle connection to `endpoint`, both at once; None (nothing
        taken) when either would mean waiting: then `reserve` and `acquire`, under a deadline."""
        limit = self._limit
        if limit is not None and limit.locked():
            return None
        conn = self._reuse(endpoint)
        if conn is not None and limit is not None:
            await limit.acquire()  # at once: it was not locked, and nothing ran since
        return conn

    async def acquire(self, endpoint: Endpoint, *, reserved: bool = False) -> UpstreamConnection:
        if not reserved:
            await self.reserve()
        try:
            return self._reuse(endpoint) or await self._connect(endpoint)
        except BaseException:
            if self._limit is not None:
                self._limit.release()
            raise

    def release(self, endpoint: Endpoint, conn: UpstreamConnection) -> None:
        """Return a connection after its answer ended; keep it only if it is clean."""
        if self._limit is not None:
            self._limit.release()
        if not conn.reusable():
            conn.abort()
            self._all.discard(conn)
            return
        conn.reset()
        conn.idle_since = conn.loop.time()
        self._idle.setdefault(endpoint.key, []).append(conn)

    def close(self) -> None:
        for conn in self._all:
            conn.abort()
        self._all.clear()
        self._idle.clear()

    def _reuse(self, endpoint: Endpoint) -> UpstreamConnection | None:
        idle = self._idle.get(endpoint.key)
        while idle:
            conn = idle.pop()
            fresh = conn.loop.time() - conn.idle_since < self.keepalive_timeout
            if fresh and not conn.closed:
                return conn
            conn.abort()
            self._all.discard(conn)
        return None

    async def _connect(self, endpoint: Endpoint) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout) as deadline:
            stretch = None if self.lag is None else Stretch(deadline, loop, self.lag)
            try:
                _, protocol = await loop.create_connection(
                    lambda: tapped(UpstreamConnection(loop, self.native)),
                    endpoint.host,
                    endpoint.port,
                    ssl=endpoint.ssl,
                )
                conn = connection_of(protocol)
            finally:
                if stretch is not None:
                    stretch.cancel()
        self._all.add(conn)
        return conn
