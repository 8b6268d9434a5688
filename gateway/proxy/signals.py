"""The request path's lifecycle, as signals its observers subscribe to.

The request path says what happened (an attempt failed, the first byte came, a stream broke,
it was resumed, the request finished) and nothing else: metrics, the events log, the logs and
the breaker's feed subscribe (as aiohttp's tracing signals do), so none of them reaches into
the path and the path imports none of them. Hooks run synchronously on the event loop, in the
request's own task, once per event, never per token: the one per-token sink (`token_gaps`) is
asked for once per answer and handed to the relay.
"""

from __future__ import annotations

from typing import Protocol

from gateway.errors import UpstreamError
from gateway.outcomes import End, Failure
from gateway.units import UnitState


class GapSink(Protocol):
    """Takes the seconds between two relayed chunks (a lock-free histogram, in practice)."""

    def observe(self, value: float) -> None: ...


class _Discard:
    __slots__ = ()

    def observe(self, value: float) -> None:
        pass


DISCARD = _Discard()


class Observer:
    """One subscriber: override the hooks it needs; the others do nothing."""

    def refused(self, status: int) -> None:
        """Answered with an error before reaching any unit (bad input, overload)."""

    def rejected(self, code: str) -> None:
        """Admission said no: `saturated` (429) or `no_routable_unit` (503)."""

    def attempt_failed(self, unit: UnitState, error: UpstreamError, started: float) -> None:
        """An attempt at `unit` failed before its first byte (`started`: loop time)."""

    def retried(self, kind: Failure) -> None:
        """A failed attempt is sent again, elsewhere, paid from the retry budget."""

    def budget_exhausted(self) -> None:
        """A retry or resumption was refused by the retry budget."""

    def first_byte(self, unit: UnitState, ttft: float) -> None:
        """The answer's first bytes came, `ttft` seconds after the request arrived."""

    def answer_ended(self, unit: UnitState, end: End, gap: float | None, started: float) -> None:
        """One answer from `unit` ended (a request's, or a continuation's): `gap` is the
        stream's own gap estimate (None for a non-streamed answer), `started` the request's
        arrival (loop time)."""

    def cancelled(self, unit_id: str) -> None:
        """The client went away (`unit_id` "none": before any unit served it)."""

    def resumed(self, broken: UnitState, outcome: str, rid: str, detail: str) -> None:
        """A stream broken on `broken` was continued elsewhere (`ok`) or ended
        (`gave_up`, `unsupported`)."""

    def finished(self, unit_id: str, status: int, duration: float) -> None:
        """The request's answer is over, served by `unit_id`."""

    def token_gaps(self, unit_id: str) -> GapSink | None:
        """Where the relay records the gaps between one unit's chunks (the hot path)."""
        return None


class Signals(Observer):
    """Fans every hook out to the subscribers, in subscription order."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []

    def subscribe(self, observer: Observer) -> None:
        self._observers.append(observer)

    def refused(self, status: int) -> None:
        for o in self._observers:
            o.refused(status)

    def rejected(self, code: str) -> None:
        for o in self._observers:
            o.rejected(code)

    def attempt_failed(self, unit: UnitState, error: UpstreamError, started: float) -> None:
        for o in self._observers:
            o.attempt_failed(unit, error, started)

    def retried(self, kind: Failure) -> None:
        for o in self._observers:
            o.retried(kind)

    def budget_exhausted(self) -> None:
        for o in self._observers:
            o.budget_exhausted()

    def first_byte(self, unit: UnitState, ttft: float) -> None:
        for o in self._observers:
            o.first_byte(unit, ttft)

    def answer_ended(self, unit: UnitState, end: End, gap: float | None, started: float) -> None:
        for o in self._observers:
            o.answer_ended(unit, end, gap, started)

    def cancelled(self, unit_id: str) -> None:
        for o in self._observers:
            o.cancelled(unit_id)

    def resumed(self, broken: UnitState, outcome: str, rid: str, detail: str) -> None:
        for o in self._observers:
            o.resumed(broken, outcome, rid, detail)

    def finished(self, unit_id: str, status: int, duration: float) -> None:
        for o in self._observers:
            o.finished(unit_id, status, duration)

    def token_gaps(self, unit_id: str) -> GapSink:
        """The first subscriber's sink (one per answer, asked once), else one that discards."""
        for o in self._observers:
            sink = o.token_gaps(unit_id)
            if sink is not None:
                return sink
        return DISCARD
