"""The forecast's feed: what each attempt's placement saw, as a subscriber to the request
path's signals. The dispatcher leaves each attempt's placement on the call (`call.placed`);
this feed tells the forecast (forecast.py) when it was sent, when its first token came and how
its answer ended, on the loop's clock; and which first copies a hedge overtook (the
forecast counts them for probation: routing/overtaken.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.errors import UpstreamError
from gateway.outcomes import End
from gateway.proxy.hedging import SECOND
from gateway.routing.forecast import Forecast, Placed
from gateway.signals import Observer
from gateway.units import UnitState


class Call(Protocol):
    """What the feed reads of the request path's Call (proxy/call.py)."""

    @property
    def placed(self) -> Placed | None: ...

    @property
    def streamed(self) -> bool: ...

    @property
    def hedge(self) -> str: ...


class ForecastFeed(Observer[Call]):
    def __init__(self, forecast: Forecast, clock: Callable[[], float]) -> None:
        self.forecast, self.clock = forecast, clock

    def attempt_started(self, call: Call, unit: UnitState) -> None:
        placed = call.placed
        if placed is not None and placed.unit == unit.id:
            # `inflight` counts this request already: the others are what it runs beside.
            self.forecast.sent(placed, unit.inflight - 1 + unit.foreign, self.clock())

    def attempt_opened(self, call: Call, unit: UnitState, status: int) -> None:
        placed = call.placed
        if placed is None:
            return
        if status == 200 and call.streamed:  # a whole body's first bytes are its last
            self.forecast.first_token(placed, self.clock())
        else:
            self.forecast.unqueue(placed)

    def attempt_failed(
        self, call: Call, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        if call.placed is not None:
            self.forecast.unqueue(call.placed)

    def attempt_cancelled(self, call: Call, unit: UnitState) -> None:
        if call.placed is not None:
            self.forecast.unqueue(call.placed)

    def hedge_ended(
        self, call: Call, winner: UnitState, loser: UnitState, second: bool, wasted: int
    ) -> None:
        if call.hedge == SECOND:  # a delayed hedge's twin began first: the first had not
            self.forecast.hedge_overtook(loser.id, self.clock())

    def answer_ended(self, call: Call, unit: UnitState, end: End, gap: float | None) -> None:
        placed = call.placed
        if placed is not None and placed.unit == unit.id and end is End.COMPLETE:
            self.forecast.finished(placed, gap, self.clock())

    def ended(self, call: Call) -> None:
        if call.placed is not None:  # the client left before its first token, say
            self.forecast.unqueue(call.placed)
