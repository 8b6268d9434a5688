"""How late the gateway's event loop runs: its own saturation, measured from inside.

A timer is due every `every` seconds; how late it runs is time the loop spent on other work.
Under a burst of thousands of requests that reaches seconds, and every deadline the gateway
keeps then expires late, and against the wrong party: a connect the kernel finished in
microseconds times out because the loop ran its timers before it looked at the socket. So
the lag is exported (`unitgate_event_loop_lag_seconds`) and kept as a running total that
deadline keepers consult (connection.py): a timeout that ran out while the gateway itself was
behind measures the gateway, not the unit.
"""

from __future__ import annotations

import asyncio

from gateway.observability.histogram import Histogram

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLag:
    __slots__ = ("_due", "_handle", "_loop", "every", "histogram", "max", "total")

    def __init__(self, every: float = 0.05) -> None:
        self.every = every
        self.histogram = Histogram(LAG_BUCKETS)
        self.total = 0.0  # seconds of lateness since start, summed over ticks
        self.max = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._due = self._loop.time() + self.every
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        late = max(0.0, now - self._due)
        self.total += late
        self.max = max(self.max, late)
        self.histogram.observe(late)
        self._due = now + self.every
        self._handle = self._loop.call_at(self._due, self._tick)
