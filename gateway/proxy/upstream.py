"""The upstream client: sends a request to a unit's leader and waits for its first bytes.

`open()` returns only once the answer's first body bytes are in hand (the whole body for a
non-streamed answer), so every failure up to that point is still invisible to the client and
can be retried elsewhere. Each failure is classified here, where it is understood, into an
UpstreamError that carries its retryability.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from dataclasses import dataclass

from gateway.config import Config, UnitConfig
from gateway.errors import UpstreamError
from gateway.outcomes import Failure
from gateway.proxy.names import Renamer
from gateway.proxy.timers import TimerSlots
from gateway.relay.native import resolve
from gateway.routing.forecast import Placed
from gateway.tls import unit_context
from gateway.upstream.connection import ConnectionBroken, UpstreamConnection
from gateway.upstream.pool import ConnectionPool, Endpoint
from gateway.upstream.request import request_head
from gateway.upstream.stretch import LagTotal

_SSE = b"text/event-stream"


@dataclass(slots=True)
class Answer:
    """A unit's answer whose head (and first bytes) arrived in time."""

    status: int
    content_type: str
    first: bytes
    # Set while the body is still streaming; None once `first` is the complete body.
    connection: UpstreamConnection | None
    endpoint: Endpoint
    # Turns the unit's name for the model back into the public id (a unit's served_model).
    names: Renamer | None = None
    # How the attempt that got it was placed (dispatch.py), for the request it answers.
    placed: Placed | None = None
    routed: str = ""

    @property
    def streaming(self) -> bool:
        return self.connection is not None


class UpstreamClient:
    def __init__(self, config: Config, lag: LagTotal | None = None) -> None:
        """Answers' bodies are read by the relay `[upstream] relay` (or UNITGATE_RELAY) picks:
        the compiled one (gateway/relay/native; built on first use unless the caller has had it
        built off the loop, as the server does) or the Python one."""
        u = config.upstream
        self.native, _ = resolve(u.relay)
        native = self.native
        self.pool = ConnectionPool(
            config.timeouts.connect, u.keepalive_timeout, u.max_connections, lag, native
        )
        self.max_connections = u.max_connections
        self._endpoints: dict[str | tuple[str, str, str, str], Endpoint] = {}
        self.timers = TimerSlots()  # the streams' idle watchdogs (relay.py)

    async def close(self) -> None:
        self.pool.close()
        self.timers.close()

    def finish(self, answer: Answer) -> None:
        """Hand a streamed answer's connection back (kept only if the answer ended cleanly)."""
        if answer.connection is not None:
            self.pool.release(answer.endpoint, answer.connection)
            answer.connection = None

    async def open(
        self,
        unit_id: str,
        base_url: str,
        path: str,
        body: bytes,
        request_id: str,
        first_byte_at: float,
        traceparent: str | None = None,
        extra: bytes = b"",
        unit: UnitConfig | None = None,
        method: str = "POST",
        on_head: Callable[[int], None] | None = None,
    ) -> Answer:
        """Send the request; by `first_byte_at` the first body bytes (or all of them) must be in.
        An https:// unit is reached with `unit`'s TLS settings (its CA, its client certificate).
        `on_head` hears the answer's status as soon as its head is in (a tied copy's start)."""
        endpoint = self._endpoint(base_url, unit)
        conn: UpstreamConnection | None = None
        reserved = False
        try:
            # Most requests find a slot and an idle connection at once: only a wait for
            # either needs a deadline that cancels (a connect, a slot another answer holds).
            conn = await self.pool.take(endpoint)
            if conn is None:
                async with asyncio.timeout_at(first_byte_at):
                    await self.pool.reserve()
                    reserved = True
                    conn = await self.pool.acquire(endpoint, reserved=True)
            reserved = True
            head = request_head(endpoint, path, len(body), request_id, traceparent, extra, method)
            conn.send(head, body)
            late = conn.deadline(first_byte_at)  # the answer fails with a TimeoutError then
            try:
                if on_head is not None:
                    await conn.wait_for(lambda: conn.head_done)
                    on_head(conn.status)
                while not _ready(conn):  # (conn.wait_for, without its frame and lambda)
                    await conn.next_wake()
            finally:
                late.cancel()
            return self._answer(unit_id, endpoint, conn)
        except BaseException as exc:
            if conn is not None:
                # Closed unless its answer ended cleanly (a whole 5xx on a keep-alive
                # connection is kept), so a unit whose answer was cut off sees the abort.
                self.pool.release(endpoint, conn)
            if not reserved and isinstance(exc, TimeoutError):
                raise self._pool_full(unit_id) from exc
            error = _classify(unit_id, exc, connected=conn is not None)
            if isinstance(error, UpstreamError):
                error.at = base_url  # for the log's line: the client is never told where
            raise error from exc

    async def get(
        self,
        unit_id: str,
        base_url: str,
        path: str,
        request_id: str,
        deadline: float,
        extra: bytes = b"",
        unit: UnitConfig | None = None,
    ) -> tuple[int, bytes | None]:
        """A GET of `path` on a leader, read whole by `deadline`: its status and body (None
        when the unit streamed an answer instead, which is closed)."""
        answer = await self.open(
            unit_id, base_url, path, b"", request_id, deadline, None, extra, unit, "GET"
        )
        streamed = answer.streaming
        self.finish(answer)
        return answer.status, None if streamed else answer.first

    def _endpoint(self, base_url: str, unit: UnitConfig | None) -> Endpoint:
        # Keyed by the TLS files too: a unit added again at its URL with other ones gets them.
        key = base_url if unit is None else (base_url, unit.tls_ca, unit.tls_cert, unit.tls_key)
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            tls = None if unit is None else unit_context(unit)
            endpoint = self._endpoints[key] = Endpoint(base_url, tls)
        return endpoint

    def _pool_full(self, unit_id: str) -> UpstreamError:
        """The deadline passed while every `[upstream].max_connections` slot was taken: the
        gateway's own limit (any unit would wait alike), not evidence against the unit."""
        return UpstreamError(
            unit_id,
            Failure.LOCAL,
            f"gateway: all {self.max_connections} upstream connections ([upstream]"
            ".max_connections) stayed busy",
            retryable=False,
        )

    def _answer(self, unit_id: str, endpoint: Endpoint, conn: UpstreamConnection) -> Answer:
        status, first = conn.status, b"".join(conn.body)
        conn.body.clear()
        content_type = conn.headers.get(b"content-type", b"application/json").decode("latin-1")
        if status >= 500:
            detail = first[:300].decode("utf-8", "replace")
            raise UpstreamError(
                unit_id, Failure.STATUS, f"HTTP {status} {detail}", retryable=True, status=status
            )
        # A whole SSE answer that arrived at once still goes through the stream relay, which
        # reads its events (an error event, a missing [DONE]) as it would read them one by one.
        if conn.complete and not content_type.startswith(_SSE.decode()):
            self.pool.release(endpoint, conn)  # resets the connection for its next request
            return Answer(status, content_type, first, None, endpoint)
        return Answer(status, content_type, first, conn, endpoint)


def _ready(conn: UpstreamConnection) -> bool:
    """Whether the answer can be handed on: whole, or a stream with its first bytes in; raises
    the answer's failure."""
    if conn.error is not None:
        raise conn.error
    if conn.complete:
        return True
    if not conn.head_done or conn.status >= 500:
        return False
    return bool(conn.body) and conn.headers.get(b"content-type", b"").startswith(_SSE)


def _classify(unit_id: str, exc: BaseException, *, connected: bool) -> BaseException:
    """Map a failure to an UpstreamError; cancellation and our own errors pass unchanged."""
    if isinstance(exc, UpstreamError | asyncio.CancelledError):
        return exc
    if isinstance(exc, TimeoutError):
        if not connected:
            # Not "connect": a refusal is a dead unit, a timeout may be a full accept queue.
            return UpstreamError(
                unit_id, Failure.CONNECT_TIMEOUT, "connect timed out", retryable=True
            )
        return UpstreamError(
            unit_id, Failure.FIRST_BYTE_TIMEOUT, "no answer in time", retryable=True
        )
    if isinstance(exc, ConnectionBroken):
        kind = Failure.PROTOCOL if "invalid HTTP" in str(exc) else Failure.RESET
        return UpstreamError(unit_id, kind, str(exc), retryable=True)
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        # The gateway's own open-files limit, not the unit: another unit would fail alike.
        return UpstreamError(unit_id, Failure.LOCAL, f"gateway: {exc.strerror}", retryable=False)
    if isinstance(exc, OSError):
        kind = Failure.CONNECT if not connected else Failure.RESET
        return UpstreamError(unit_id, kind, f"{type(exc).__name__}: {exc}", retryable=True)
    return exc
