"""A probe's deadline, judged by what the socket shows when it runs out, not by a timer.

A node has `within` seconds to answer once the probe's request went out. Just before that
deadline a check looks at the facts before calling it a timeout:
- an answer that arrived (bytes read since the request went out, or bytes waiting unread in
  the socket because the gateway's process or loop was not running) came in time: the loop
  gets a moment to read it, look after look;
- a request that went out late (a connect the loop was slow to finish, a stall before the
  write) gives the node its `within` from then;
- a connect still pending gets one look a moment later, so that a connect the kernel finished
  while the loop was behind is not a timeout.
Otherwise the deadline runs out where it was set. A node that does not answer times out close
to its timeout however late the machine runs the gateway's timers (a check that runs late
finds an empty socket and ends the probe then); nothing moves the deadline for lateness alone.
All of it within LIMIT timeouts of the start. Nothing runs unless a deadline is nearly up.
"""

from __future__ import annotations

import asyncio
import select

from gateway.upstream.connection import UpstreamConnection

# A probe ends at most this many timeouts after it started, whatever the checks find.
LIMIT = 4.0
# The check runs this long before the deadline: the loop's clock counts whole milliseconds.
AHEAD = 0.001
# How long the loop is given to read an answer that is there, or to finish a pending connect.
LOOK = 0.005


class Sent:
    """What the exchange reports as it goes: its connection, and when the request went out
    (loop time; 0.0 until then)."""

    __slots__ = ("at", "conn")

    def __init__(self) -> None:
        self.conn: UpstreamConnection | None = None
        self.at = 0.0

    def went_out(self, conn: UpstreamConnection, now: float) -> None:
        self.conn, self.at = conn, now


class Lookout:
    """Checks `deadline` just before it expires and moves it only for what the socket shows.
    `cancel()` once the exchange is over."""

    __slots__ = ("deadline", "handle", "limit", "looked", "loop", "sent", "within")

    def __init__(
        self, deadline: asyncio.Timeout, loop: asyncio.AbstractEventLoop, sent: Sent
    ) -> None:
        when = deadline.when()
        assert when is not None
        now = loop.time()
        self.deadline, self.loop, self.sent = deadline, loop, sent
        self.within = when - now
        self.limit = now + LIMIT * self.within
        self.looked = False  # a pending connect has had its look
        self.handle = loop.call_at(when - AHEAD, self._check)

    def _check(self) -> None:
        when = self.deadline.when()
        if when is None or self.deadline.expired():
            return  # expired: a lagging loop may run the deadline's own timer first
        move = self._owed(when, self.loop.time())
        if move is None or move <= when:
            return
        move = min(move, self.limit)
        self.deadline.reschedule(move)
        if move < self.limit:
            self.handle = self.loop.call_at(move - AHEAD, self._check)

    def _owed(self, when: float, now: float) -> float | None:
        """Where the deadline should be, from what the exchange shows; None: where it is."""
        sent = self.sent
        conn = sent.conn
        if conn is None or sent.at == 0.0:  # still connecting
            if self.looked:
                return None
            self.looked = True
            return now + LOOK
        if sent.at + self.within > when + AHEAD:
            return sent.at + self.within  # the request went out late
        if answered(conn, sent.at):
            return now + LOOK
        return None

    def cancel(self) -> None:
        self.handle.cancel()


def answered(conn: UpstreamConnection, since: float) -> bool:
    """Whether any of the answer is in: read by the loop since `since`, or waiting unread."""
    if conn.last_data >= since or conn.complete:
        return True
    transport = conn.transport
    if transport is None or conn.closed:
        return False
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return bool(readable)
