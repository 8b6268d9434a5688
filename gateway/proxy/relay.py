"""Relaying a streamed answer from a unit's connection to the client.

The unit's body bytes go from the upstream connection's read callback straight to the
client's transport (re-framed as HTTP chunks): no task wake-up per token. A plain stream's SSE
bytes pass unchanged; a resumable one's pass through its StreamTracker first, which forwards
whole events only. The request task sleeps until the answer ends, the client's send buffer
fills (then it waits for the client to drain while upstream reading is paused), or something
fails; the caller (stream.py) then continues the stream on another unit or ends it with an
explicit SSE `error` event, never a silent truncation.

The per-read work is pump.py's: in one compiled call per read with the native relay
(gateway/relay/native), else in Python, the reference the native one is tested against.
"""

from __future__ import annotations

import asyncio

from gateway.errors import error_body, with_request_id
from gateway.outcomes import End
from gateway.proxy.exchange import Exchange
from gateway.proxy.timers import TimerSlots
from gateway.proxy.upstream import Answer
from gateway.relay.pace import GapSink, quiet_after
from gateway.relay.pump import AnyPump, attach
from gateway.relay.tracker import StreamTracker
from gateway.relay.usage import UsageReader
from gateway.upstream.connection import ConnectionBroken, UpstreamConnection

DONE = b"data: [DONE]\n\n"


class IdleTimeout(Exception):
    pass


class UnitEjected(ConnectionBroken):
    """The health checks took the unit out, and then its stream went quiet."""


class StreamRelay:
    """One client stream, fed by one upstream answer or, after resumptions, by several.

    `start` sends the response head with the first answer's first bytes; `pump` relays an
    answer until it ends and says how; the caller then either continues the stream with
    another answer or ends it (`finish` / `fail`)."""

    __slots__ = (  # one per open stream: no instance dict
        "_ended",
        "_mid_event",
        "_watchdog",
        "deadline",
        "gap",
        "headers",
        "idle",
        "quiet",
        "request",
        "started",
        "timers",
        "tracker",
        "usage",
    )

    def __init__(
        self,
        request: Exchange,
        headers: dict[str, str],
        deadline: float,
        idle: float,
        timers: TimerSlots,
        tracker: StreamTracker | None = None,
        quiet: tuple[float, float] = (1.0, 4.0),
        usage: UsageReader | None = None,
    ) -> None:
        """`timers` time its idle watchdog; `quiet` is (floor, factor) of the pace rule
        (relay/pace.py) that decides when a stream on an ejected unit counts as stalled;
        `usage` reads the answer's usage."""
        self.usage = usage
        self.timers = timers
        assert request.transport is not None
        self.request = request
        self.headers = headers
        self.deadline = deadline
        self.idle = idle
        self.tracker = tracker
        self.quiet = quiet
        self.started = False  # the head went out
        # Whether the client's stream stops inside an SSE event (only a verbatim relay can
        # leave it so): a gateway-made event must then first close it, or it is unreadable.
        self._mid_event = False
        self._ended = False  # an answer's last write ended the client's stream too
        self._watchdog: _IdleWatchdog | None = None  # the answer being relayed's
        self.gap: float | None = None  # the last relayed answer's gap estimate, once it ended

    async def start(self, answer: Answer) -> bool:
        """Open the client's stream; False if the client is already gone. The first bytes go
        out with what follows them, through the pump (`attach`): at 0 ms between tokens they
        can be most of the answer, and the relay reads them alike. On the lean front the head
        goes in the same write as they do (a StreamResponse's goes at once)."""
        # Its type without parameters (a charset), set as a header: the content_type property
        # would parse it again.
        self.headers["Content-Type"] = answer.content_type.split(";", 1)[0]
        self.started = True
        return await self.request.open_stream(answer.status, self.headers)

    async def pump(self, answer: Answer, itl: GapSink) -> End:
        """Relay `answer` to its end: `complete`, `client_gone`, or how the upstream failed
        (`reset`, `idle_timeout`, `total_timeout`, `truncated`, `unit_error`, `unit_ejected`).
        Gaps between chunks go to `itl`, the serving unit's histogram. The answer's first
        bytes (`answer.first`) go first, as no gap."""
        conn, request = answer.connection, self.request
        assert conn is not None and request.transport is not None
        pending = [answer.first] if answer.first else []
        answer.first = b""
        end: End | None = None
        pump = attach(
            conn,
            request.transport,
            itl,
            self.tracker,
            self.usage,
            answer.names,
            self._mid_event,
            pending,
            request.take_head(),
            request.can_end_in_place,
        )
        del pending  # the first bytes are the client's now: not held for the stream's life
        watchdog = _IdleWatchdog(conn, pump, self.idle, self.quiet, self.deadline, self.timers)
        self._watchdog = watchdog
        try:
            settled = pump.settled
            while True:  # the watchdog fails the connection at the deadline
                while not conn.ready(settled):
                    await conn.next_wake()
                if not pump.paused:
                    break
                async with asyncio.timeout_at(self.deadline):
                    await request.drain()
                pump.paused = False
                assert conn.transport is not None
                conn.transport.resume_reading()
        except UnitEjected:
            end = End.UNIT_EJECTED
        except ConnectionBroken:  # also what the pump's own aborts lead to (see push); if
            # gone, aborted because the client left, not reset by the unit
            end = End.CLIENT_GONE if pump.gone else End.UNIT_ERROR if pump.failed else End.RESET
        except IdleTimeout:
            end = End.IDLE_TIMEOUT
        except ConnectionError:  # the client's side, while draining
            end = End.CLIENT_GONE
        except TimeoutError:
            end = End.TOTAL_TIMEOUT
        finally:
            watchdog.cancel()
            self._watchdog = None
            self.gap = pump.gap
            conn.sink = None
            conn.events = None
            self._mid_event = pump.mid_event
            self._ended = pump.ended
            pump.finish()
        return self._end(pump, end)

    def _end(self, pump: AnyPump, broke: End | None) -> End:
        """How the answer ended, once its pump settled or the wait for it `broke`."""
        if pump.ended:
            # The client's stream is whole and closed, whatever the unit's connection did
            # after its last bytes (a failure that raced them ends nothing more).
            return End.COMPLETE
        if broke is not None:
            return broke
        if pump.gone:
            return End.CLIENT_GONE
        if pump.failed:
            return End.UNIT_ERROR
        if self.tracker is not None and not self.tracker.done:
            return End.TRUNCATED
        return End.COMPLETE

    def on_unit_ejected(self, reason: str) -> bool:
        """The serving unit was ejected: a resumable stream breaks (to be resumed elsewhere)
        once it is quiet by its own pace; one whose tokens keep coming runs to its end."""
        if self._watchdog is None or self.tracker is None:
            return False
        self._watchdog.tighten(reason)
        return True

    def pace(self) -> tuple[float, float | None] | None:
        watchdog = self._watchdog
        return None if watchdog is None else watchdog.pace()

    async def write(self, data: bytes) -> bool:
        """Send gateway-made bytes (a closing the tracker built); False if the client left."""
        assert self.started
        try:
            await self.request.write(data)
        except ConnectionError:
            return False
        return True

    async def finish(self) -> bool:
        """End the stream cleanly; False if the client had already left."""
        assert self.started
        if self._ended:  # its last chunk went with the answer's last bytes
            self.request.ended_in_place()
            return True
        try:
            await self.request.end_stream()
        except ConnectionError:
            return False
        return True

    async def fail(self, kind: End, detail: str | None = None) -> bool:
        """End the stream with an explicit SSE error event (and [DONE] after it); `detail`
        says why it was not resumed (a kind, never an address: the log has those). The event
        names the request id the response head gave. False if the client had already left."""
        assert self.started
        message = kind.message if detail is None else f"{kind.message}; not resumed: {detail}"
        rid = self.headers.get("x-request-id")
        if rid is not None:
            message = with_request_id(message, rid)
        event = b"data: " + error_body(message, "upstream_error", code=kind) + b"\n\n"
        if self._mid_event:
            event = b"\n\n" + event
        try:
            await self.request.write(event + DONE)
            await self.request.end_stream()
        except ConnectionError:
            return False
        return True


class _IdleWatchdog:
    """One timer per stream, re-armed lazily: no timer churn per token. It also ends the
    stream at the request's deadline (one timer where a Timeout would add another). Its
    timer is a place in the gateway's shared slots (timers.py), not a loop timer of its own,
    and so runs up to a slot late."""

    __slots__ = ("conn", "deadline", "ejected", "idle", "pump", "quiet", "slot", "timers")

    def __init__(
        self,
        conn: UpstreamConnection,
        pump: AnyPump,
        idle: float,
        quiet: tuple[float, float],
        deadline: float,
        timers: TimerSlots,
    ) -> None:
        self.conn, self.pump, self.idle, self.quiet = conn, pump, idle, quiet
        self.deadline, self.timers = deadline, timers
        self.ejected: str | None = None  # why the unit was ejected, once it was
        self.slot = timers.add(min(conn.loop.time() + idle, deadline), self)

    def tighten(self, reason: str) -> None:
        self.ejected = reason
        self.timers.discard(self.slot, self)
        self.due()

    def pace(self) -> tuple[float, float | None]:
        return max(self.conn.last_data, self.pump.last), self.pump.gap

    def _limit(self) -> float:
        if self.ejected is None:
            return self.idle
        return min(self.idle, quiet_after(self.pump.gap, *self.quiet))

    def due(self) -> None:
        now = self.conn.loop.time()
        if now >= self.deadline - 0.001:  # the loop's clock may run a timer a hair early
            self.conn.fail(TimeoutError("the request's total time ran out"))
            return
        quiet_since, limit = self.pace()[0], self._limit()
        if self.pump.paused or now - quiet_since < limit:
            when = min(max(quiet_since + limit, now + 0.01), self.deadline)
            self.slot = self.timers.add(when, self)
            return
        if self.ejected is not None:
            self.conn.fail(
                UnitEjected(f"unit ejected ({self.ejected}), then quiet for {limit:.2g} s")
            )
        else:
            self.conn.fail(IdleTimeout(f"the unit sent nothing for {self.idle:g} s"))

    def cancel(self) -> None:
        self.timers.discard(self.slot, self)
