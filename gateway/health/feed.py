"""The breakers' feed: live traffic outcomes, classified, as a subscriber to the request
path's signals. The classifier (classify.py) decides what is evidence against a unit; the
gate (gate.py) applies what the breakers decide."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from gateway.errors import UpstreamError
from gateway.health.classify import Evidence, attempt_failure, stream_end
from gateway.outcomes import End
from gateway.signals import Observer
from gateway.units import UnitState

# (unit, ok, when its attempt or request began, loop time) -> None: the gate's record.
Record = Callable[[UnitState, bool, float], None]


class Call(Protocol):
    """What the feed reads of the request path's Call (proxy/call.py)."""

    @property
    def start(self) -> float:
        """Loop time of the request's arrival."""
        ...


class BreakerFeed(Observer[Call]):
    def __init__(
        self,
        record: Record,
        traffic: Callable[[str, float], bool],
        idle: float,
        pace_factor: float,
    ) -> None:
        """`traffic(unit_id, now)`: whether the unit's streams keep their pace (live.py)."""
        self.record, self.traffic = record, traffic
        self.idle, self.pace_factor = idle, pace_factor

    def attempt_failed(
        self, call: Call, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        flowing = self.traffic(unit.id, asyncio.get_running_loop().time())
        if attempt_failure(error.kind, flowing) is Evidence.FAILURE:
            self.record(unit, False, started)

    def answer_ended(self, call: Call, unit: UnitState, end: End, gap: float | None) -> None:
        evidence = stream_end(end, gap, self.idle, self.pace_factor)
        if evidence is not Evidence.NONE:
            self.record(unit, evidence is Evidence.OK, call.start)
