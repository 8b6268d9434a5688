"""The one admission slot a request holds: taken and given back here, and nowhere else.

A request holds at most one unit's slot at a time, whichever unit serves it at the moment:
an attempt that fails gives its slot back before the next one waits for another, a stream
broken mid-way gives its unit's slot back before its continuation is admitted elsewhere, and
whatever path ends the request, the handler's `with` gives back what is still held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from gateway.routing.admission import DEFAULT_ASK, Admission, Ask
from gateway.units import UnitState

PREEMPTED = "preempted by a request of a more important class"


class Lease:
    __slots__ = ("admission", "ask", "preempted", "started", "task", "unit")

    def __init__(self, admission: Admission, task: asyncio.Task[object] | None = None) -> None:
        """`task`: the request's (asked of asyncio when not given)."""
        self.admission = admission
        self.ask: Ask = DEFAULT_ASK  # the request's class, tenant and tokens, set by intake
        self.unit: UnitState | None = None
        # Preemption ([priority].preempt): the request's task, cancelled to preempt it before
        # its answer begins (`started`); `preempted` tells the handler to answer 503.
        self.task = task if task is not None else _current_task()
        self.started = False
        self.preempted = False

    def preempt(self) -> None:
        if not self.preempted and self.task is not None:
            self.preempted = True
            self.task.cancel(PREEMPTED)

    async def take(self, pick: Callable[[], UnitState | None]) -> UnitState:
        """Give back what is held, then wait for a slot on the unit `pick` returns."""
        self.drop()
        unit = await self.admission.acquire(pick, self.ask, self)
        self.unit = unit
        return unit

    def drop(self) -> None:
        if self.unit is not None:
            unit, self.unit = self.unit, None
            self.admission.release(unit, self.ask.klass, self, self.ask.tenant)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.drop()


def _current_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no loop: a test building a call by hand
        return None
