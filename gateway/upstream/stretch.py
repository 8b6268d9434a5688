"""Deadlines measured in the event loop's responsive time.

A connect or a probe the kernel finished in microseconds must not time out because the
gateway's own loop was busy (a burst of requests, thousands of first connects at start-up)
and ran its timers before it looked at the socket. `Stretch` checks a deadline just before it
expires and moves it on by the time the loop spent behind schedule meanwhile, up to
MAX_STRETCH timeouts: a node that does not answer still times out.

How far behind the loop was is read one of two ways:
- from a `LagTotal` (observability/looplag.LoopLag), which sums the loop's lateness; asked to
  sample at its shortest interval while the deadline is out (the request path's connects);
- or, with none, from the check's own timer: one that runs late says the loop was busy until
  then. Nothing runs unless a deadline is nearly up (the probes: thousands a second, so no
  sampler is kept awake for them). How long the loop was busy before the check was due is
  not known this way, so the deadline moves on by at least GRACE of the timeout: what was
  held up (a connect's completion, a request not yet sent) gets a round trip's time.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class LagTotal(Protocol):
    """The event loop's lateness summed since start (observability/looplag.LoopLag keeps it;
    the request path reads only this number, not the metrics around it)."""

    @property
    def total(self) -> float: ...

    def hurry(self, until: float) -> None:
        """Sample the lag at its shortest interval until loop time `until`."""


# A stretched deadline ends at most this many timeouts after it started.
MAX_STRETCH = 4.0
# The check runs this long before the deadline: the loop's clock counts whole milliseconds.
AHEAD = 0.001


class Stretch:
    """Just before `deadline` expires, moves it on by the loop's lateness since the last look,
    up to MAX_STRETCH timeouts. `cancel()` once what it bounds is over."""

    __slots__ = ("deadline", "handle", "lag", "limit", "loop", "seen")

    def __init__(
        self, deadline: asyncio.Timeout, loop: asyncio.AbstractEventLoop, lag: LagTotal
    ) -> None:
        when = deadline.when()
        assert when is not None
        self.deadline, self.loop, self.lag = deadline, loop, lag
        self.limit = loop.time() + MAX_STRETCH * (when - loop.time())
        self.seen = lag.total
        lag.hurry(self.limit)  # sampled every 50 ms while the deadline is out
        self.handle = loop.call_at(when - AHEAD, self._check)

    def _check(self) -> None:
        when = self.deadline.when()
        if when is None or self.deadline.expired() or when >= self.limit:
            return  # expired: a lagging loop may run the deadline's own timer first
        owed, self.seen = self.lag.total - self.seen, self.lag.total
        if owed < 0.001:
            return
        when = min(when + owed, self.limit)
        self.deadline.reschedule(when)
        self.handle = self.loop.call_at(when - AHEAD, self._check)

    def cancel(self) -> None:
        self.handle.cancel()
