"""Admission control: per-unit in-flight caps plus one bounded FIFO wait queue with a deadline.

A request that finds every candidate unit full waits (FIFO) instead of being refused at once,
because LLM requests finish every few seconds and a short wait beats a client retry storm. The
queue is bounded in size and in time; past either bound the answer is 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeVar

from gateway.errors import Overloaded


class Slot(Protocol):
    inflight: int


S = TypeVar("S", bound=Slot)


class _Waiter:
    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[None] | None = None


class Admission:
    def __init__(
        self, queue_size: int, queue_timeout: float, retry_after: int, limit: int | None = None
    ) -> None:
        """`limit`: slots over all units at once (the gateway's own capacity, e.g. what its
        open-files limit allows); past it requests queue as if every unit were full."""
        self.queue_size = queue_size
        self.queue_timeout = queue_timeout
        self.retry_after = retry_after
        self.limit = limit
        self.inflight = 0
        self._waiters: deque[_Waiter] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self, pick: Callable[[], S | None]) -> S:
        """Take a slot on the unit `pick` returns; `pick` raises Overloaded(503) if none can ever.

        New arrivals do not overtake queued requests.
        """
        if not self._waiters:
            unit = self._take(pick)
            if unit is not None:
                return unit
        if len(self._waiters) >= self.queue_size:
            raise self.saturated("all units are at capacity and the wait queue is full")
        return await self._wait(pick)

    def release(self, unit: Slot) -> None:
        unit.inflight -= 1
        self.inflight -= 1
        self.wake(None)

    def _take(self, pick: Callable[[], S | None]) -> S | None:
        if self.limit is not None and self.inflight >= self.limit:
            return None
        unit = pick()
        if unit is not None:
            unit.inflight += 1
            self.inflight += 1
        return unit

    def wake(self, after: _Waiter | None) -> None:
        """Wake the first sleeping waiter behind `after` (or the first of all)."""
        started = after is None
        for waiter in self._waiters:
            if not started:
                started = waiter is after
                continue
            if waiter.future is not None and not waiter.future.done():
                waiter.future.set_result(None)
                return

    def wake_all(self) -> None:
        """Routability changed: every waiter must look again (some may now get a 503)."""
        for waiter in self._waiters:
            if waiter.future is not None and not waiter.future.done():
                waiter.future.set_result(None)

    async def _wait(self, pick: Callable[[], S | None]) -> S:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.queue_timeout
        waiter = _Waiter()
        self._waiters.append(waiter)
        took = False
        try:
            while True:
                waiter.future = loop.create_future()
                try:
                    async with asyncio.timeout_at(deadline):
                        await waiter.future
                except TimeoutError:
                    raise self.saturated(
                        f"all units stayed at capacity for {self.queue_timeout:g} s"
                    ) from None
                unit = self._take(pick)
                if unit is not None:
                    took = True
                    return unit
                # The freed slot did not fit this request: pass the wake-up on.
                self.wake(waiter)
        finally:
            if not took and waiter.future is not None and waiter.future.done():
                self.wake(waiter)  # a wake-up we can no longer use (timeout or cancel)
            self._waiters.remove(waiter)

    def saturated(self, message: str) -> Overloaded:
        return Overloaded(message, status=429, code="saturated", retry_after=self.retry_after)
