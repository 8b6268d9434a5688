"""The one admission slot a request holds: taken and given back here, and nowhere else.

A request holds at most one unit's slot at a time, whichever unit serves it at the moment:
an attempt that fails gives its slot back before the next one waits for another, a stream
broken mid-way gives its unit's slot back before its continuation is admitted elsewhere, and
whatever path ends the request, the handler's `with` gives back what is still held.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from gateway.routing.admission import Admission
from gateway.units import UnitState


class Lease:
    __slots__ = ("admission", "unit")

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.unit: UnitState | None = None

    async def take(self, pick: Callable[[], UnitState | None]) -> UnitState:
        """Give back what is held, then wait for a slot on the unit `pick` returns."""
        self.drop()
        unit = await self.admission.acquire(pick)
        self.unit = unit
        return unit

    def drop(self) -> None:
        if self.unit is not None:
            unit, self.unit = self.unit, None
            self.admission.release(unit)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.drop()
