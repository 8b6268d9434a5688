"""Lingering close: how the lean front ends a connection whose request body is still coming.

An answer written while the request's body is still coming (a refusal before the body is
read: 413 on its length, 401) ends the connection (`Connection: close`). Closing a socket
with unread bytes in it, or with more still arriving, makes the kernel reset the connection,
and a client that sends its whole body before it reads (urllib, requests, the `openai` SDK)
then sees that reset, not the answer already in its receive buffer; the SDK retries a reset,
so one refused upload becomes three. So, as nginx's `lingering_close` and RFC 9112 section
9.6 do: the answer goes out, the write side is shut (the client reads its end at once), and
what the client still sends is read and dropped, never kept, until it closes its side, or is
quiet for LINGER_IDLE_S, or LINGER_S have passed, or LINGER_BYTES have been dropped. Then the
connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

log = logging.getLogger("unitgate.front")

LINGER_S = 10.0  # in all (aiohttp's lingering_time; nginx's lingering_time is 30 s)
LINGER_IDLE_S = 5.0  # without a byte from the client (nginx's lingering_timeout)
LINGER_BYTES = 256 * 1024 * 1024  # dropped in all: past that the connection is closed


@dataclass(frozen=True, slots=True)
class LingerLimits:
    seconds: float = LINGER_S
    idle: float = LINGER_IDLE_S
    bytes: int = LINGER_BYTES


class Linger(asyncio.Protocol):
    """One connection's lingering close, from the moment its answer has been written: the
    connection's protocol from then on (the lean front's hands it over). It drops what it
    reads and closes the transport when a limit is reached; EOF from the client closes it too
    (`eof_received` is asyncio's: the transport closes itself)."""

    __slots__ = (
        "_end",
        "_last",
        "_start",
        "_timer",
        "discarded",
        "done",
        "limits",
        "owner",
        "transport",
        "why",
    )

    def __init__(
        self, transport: asyncio.Transport, limits: LingerLimits, owner: set[Linger]
    ) -> None:
        loop = asyncio.get_running_loop()
        self.transport, self.limits, self.owner = transport, limits, owner
        self.discarded = 0  # bytes read and dropped
        self._start = self._last = now = loop.time()  # _last: when bytes were last read
        self.why = "the client closed"  # what ends it
        self._end = now + limits.seconds
        self.done: asyncio.Future[None] = loop.create_future()  # set once the connection is lost
        self._timer: asyncio.TimerHandle | None = None
        owner.add(self)
        transport.set_protocol(self)
        if transport.can_write_eof():  # not on TLS, where only a close can end the stream
            transport.write_eof()
        transport.resume_reading()
        self._arm()

    def data_received(self, data: bytes) -> None:
        self.discarded += len(data)
        self._last = asyncio.get_running_loop().time()
        if self.discarded > self.limits.bytes:
            self.close(f"past {self.limits.bytes} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        took = asyncio.get_running_loop().time() - self._start
        log.debug(
            "front: lingering close: %s after %.3f s, %d bytes dropped",
            self.why,
            took,
            self.discarded,
        )
        self._cancel()
        self.owner.discard(self)
        if not self.done.done():
            self.done.set_result(None)

    def close(self, why: str) -> None:
        """End it now: a clean close, unless the answer is still unsent (the client does not
        read it: then a reset, as for any connection given up on)."""
        self.why = why
        self._cancel()
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    def _arm(self) -> None:
        """The timer runs to the next moment a limit could be reached; bytes read in between
        only move `_last`, so a busy upload costs no timer per read."""
        when = min(self._last + self.limits.idle, self._end)
        self._timer = asyncio.get_running_loop().call_at(when, self._check)

    def _check(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        if now >= self._end:
            self.close(f"past {self.limits.seconds:g} s")
        elif now >= self._last + self.limits.idle:
            self.close(f"quiet for {self.limits.idle:g} s")
        else:
            self._arm()

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
