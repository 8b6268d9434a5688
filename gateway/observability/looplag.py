"""How late the gateway's event loop runs: its own saturation, measured from inside.

A timer is due every so often; how late it runs is time the loop spent on other work. Under a
burst of thousands of requests that reaches seconds, and every deadline the gateway keeps then
expires late, and against the wrong party: a connect the kernel finished in microseconds times
out because the loop ran its timers before it looked at the socket. So the lag is exported
(`unitgate_event_loop_lag_seconds`) and kept as a running total that deadline keepers consult
(upstream/pool.py): a timeout that ran out while the gateway itself was behind measures the
gateway, not the unit.

The timer is due `every` seconds (50 ms) after a tick that ran late; each tick on time doubles
the gap, up to `idle_every` (0.5 s). On this VM a timer's wake-up alone costs about 125 us of
CPU, so a fixed 50 ms tick cost an idle gateway 2.5 ms of CPU a second; a loop on time ticks
twice a second. A stall as long as the longest gap is always seen (a tick falls due in it), and
a deadline that will consult the total asks for the short gap until it has passed (`hurry`).
"""

from __future__ import annotations

import asyncio

from gateway.observability.histogram import Histogram

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ON_TIME_S = 0.005  # a tick at most this late found the loop on time (its clock counts in ms)


def next_gap(gap: float, late: float, hurried: bool, every: float, idle_every: float) -> float:
    """The gap before the next tick: the short one after a late tick or while `hurried`, else
    twice the last."""
    if late > ON_TIME_S or hurried:
        return every
    return min(gap * 2.0, idle_every)


class LoopLag:
    __slots__ = (
        "_due",
        "_fast_until",
        "_gap",
        "_handle",
        "_loop",
        "every",
        "histogram",
        "idle_every",
        "max",
        "total",
    )

    def __init__(self, every: float = 0.05, idle_every: float = 0.5) -> None:
        if not 0 < every <= idle_every:
            raise ValueError(f"need 0 < every <= idle_every, not {every!r}, {idle_every!r}")
        self.every, self.idle_every = every, idle_every
        self.histogram = Histogram(LAG_BUCKETS)
        self.total = 0.0  # seconds of lateness since start, summed over ticks
        self.max = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._gap = every
        self._fast_until = 0.0  # loop time until which the gap stays `every` (hurry)

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Ticks on `loop`, by default the running one."""
        self._loop = loop or asyncio.get_running_loop()
        self._schedule(self._loop.time() + self.every)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def hurry(self, until: float) -> None:
        """Tick every `every` seconds until loop time `until`, from at most `every` from now:
        a deadline that reads `total` before then sees the loop's lag sampled that recently."""
        self._fast_until = max(self._fast_until, until)
        if self._handle is None or self._loop is None:
            return
        due = self._loop.time() + self.every
        self._gap = self.every
        if due < self._due:
            self._handle.cancel()
            self._schedule(due)

    def _schedule(self, due: float) -> None:
        assert self._loop is not None
        self._due = due
        self._handle = self._loop.call_at(due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        late = max(0.0, now - self._due)
        self.total += late
        self.max = max(self.max, late)
        self.histogram.observe(late)
        hurried = now < self._fast_until
        self._gap = next_gap(self._gap, late, hurried, self.every, self.idle_every)
        self._schedule(now + self._gap)
