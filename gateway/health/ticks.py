"""Shared wake-ups for the probers: a round whose window holds another prober's tick joins it.

A prober's next round may start anywhere in its window: `interval` +- `jitter` after its last
round began. Each wake-up of a timer costs the event loop about as much as the probe it
starts, so a round whose window already holds a planned tick with room joins that tick (the
one nearest its own random start) instead of planning one of its own. At most `cap` rounds
share a tick, so a large fleet's rounds still spread over the interval in small groups
instead of bursting at once. No round starts outside its window, so the interval and jitter
mean what they did.

`TickPlan` is the policy (pure: times in, times out); `ProbeTicks` runs it on the event loop,
one timer per tick.
"""

from __future__ import annotations

import asyncio
import math
from bisect import bisect_left, insort

# Rounds that share one wake-up, at most: about a millisecond of the loop's time at once.
TICK_CAP = 8


class TickPlan:
    """The planned ticks (loop times) and how many rounds wait on each."""

    def __init__(self, cap: int = TICK_CAP) -> None:
        if cap < 1:
            raise ValueError(f"cap must be at least 1, not {cap}")
        self.cap = cap
        self._times: list[float] = []  # sorted
        self._waiting: dict[float, int] = {}

    def __len__(self) -> int:
        return len(self._times)

    def waiting(self, when: float) -> int:
        """Rounds waiting on the tick at `when` (0: no such tick)."""
        return self._waiting.get(when, 0)

    def choose(self, lo: float, hi: float, target: float) -> tuple[float, bool]:
        """The tick a round due in [lo, hi] wakes at, and whether it is a new one: the planned
        tick with room nearest `target`, else a new tick at `target` (clamped to the window)."""
        if hi < lo:
            raise ValueError(f"an empty window: [{lo}, {hi}]")
        target = min(max(target, lo), hi)
        times, best = self._times, None
        i = bisect_left(times, lo)
        while i < len(times) and times[i] <= hi:
            t = times[i]
            room = self._waiting[t] < self.cap
            if room and (best is None or abs(t - target) < abs(best - target)):
                best = t
            i += 1
        if best is not None:
            self._waiting[best] += 1
            return best, False
        while target in self._waiting:  # a full tick at that very time: one just after it
            target = math.nextafter(target, math.inf)
        insort(times, target)
        self._waiting[target] = 1
        return target, True

    def leave(self, when: float) -> bool:
        """A round stopped waiting on the tick at `when` before it came; True if none waits now
        (the tick is dropped: its timer can go)."""
        left = self._waiting.get(when, 0) - 1
        if left > 0:
            self._waiting[when] = left
            return False
        self.fired(when)
        return True

    def fired(self, when: float) -> None:
        """The tick at `when` came (or has no one left): forget it."""
        if self._waiting.pop(when, None) is not None:
            del self._times[bisect_left(self._times, when)]


class ProbeTicks:
    """`TickPlan` on the event loop: one timer per tick wakes every round waiting on it.

    Owned by the health supervisor, which closes it when it stops its probers."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int = TICK_CAP) -> None:
        self.loop = loop
        self.plan = TickPlan(cap)
        self._waiters: dict[float, list[asyncio.Future[None]]] = {}
        self._timers: dict[float, asyncio.TimerHandle] = {}
        self.fired = 0  # ticks that came
        self.woken = 0  # rounds they woke

    def __len__(self) -> int:
        return len(self._timers)

    async def sleep_within(self, lo: float, hi: float, target: float) -> None:
        """Sleep until a tick in [lo, hi] (loop times), near `target`; at once if `hi` has
        passed (as `asyncio.sleep(0)` does, the loop runs others first)."""
        loop = self.loop
        now = loop.time()
        if hi <= now:
            await asyncio.sleep(0)
            return
        when, new = self.plan.choose(max(lo, now), hi, target)
        waiter: asyncio.Future[None] = loop.create_future()
        if new:
            self._waiters[when] = [waiter]
            self._timers[when] = loop.call_at(when, self._fire, when)
        else:
            self._waiters[when].append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled() or not waiter.done():
                self._leave(when, waiter)
            raise

    def _leave(self, when: float, waiter: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(when)
        if waiters is None:  # the tick came already
            return
        waiters.remove(waiter)
        if self.plan.leave(when):
            del self._waiters[when]
            self._timers.pop(when).cancel()

    def _fire(self, when: float) -> None:
        self.plan.fired(when)
        del self._timers[when]
        self.fired += 1
        for waiter in self._waiters.pop(when):
            if not waiter.done():
                waiter.set_result(None)
                self.woken += 1

    def close(self) -> None:
        """Cancel every tick's timer and waiter (the probers are being cancelled too)."""
        for timer in self._timers.values():
            timer.cancel()
        waiters = [w for ws in self._waiters.values() for w in ws]
        self._timers.clear()
        self._waiters.clear()
        self.plan = TickPlan(self.plan.cap)
        for waiter in waiters:
            waiter.cancel()
