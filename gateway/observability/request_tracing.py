"""The request path's trace spans, as a subscriber to its signals (gateway/signals.py).

A server span per client request (continuing the client's trace if it sent a
`traceparent`), a client span per attempt at a unit, whose context the attempt carries to the
leader (`call.traceparent`). The spans live in the call's `trace` slot, so a request that
ends abnormally leaves nothing behind: `ended` closes whatever is still open. Subscribed only
when tracing is on, so with the exporter "none" the request path pays nothing for it.
"""

from __future__ import annotations

import asyncio

from gateway.errors import UpstreamError
from gateway.observability.tracing import Span, Tracing, end_span
from gateway.outcomes import Resumption
from gateway.proxy.call import Call
from gateway.signals import Observer
from gateway.units import UnitState


class _Trace:
    __slots__ = ("attempts", "request")

    def __init__(self, request: Span) -> None:
        self.request = request
        # The attempts in flight, by unit: one, or a hedged request's two copies.
        self.attempts: dict[str, Span] = {}


class TracingObserver(Observer[Call]):
    def __init__(self, tracing: Tracing) -> None:
        assert tracing.enabled
        self.tracing = tracing

    def received(self, call: Call) -> None:
        span = self.tracing.request_span(f"{call.method} {call.path}", call.headers)
        assert span is not None
        span.set_attribute("unitgate.request_id", call.rid)
        call.trace = _Trace(span)

    def validated(self, call: Call) -> None:
        trace = _of(call)
        trace.request.set_attributes(
            {"unitgate.model": call.info.model, "unitgate.stream": call.info.stream}
        )

    def attempt_started(self, call: Call, unit: UnitState) -> None:
        trace = _of(call)
        span, call.traceparent = self.tracing.attempt_span(trace.request, unit.id, call.attempts)
        trace.attempts[unit.id] = span

    def attempt_opened(self, call: Call, unit: UnitState, status: int) -> None:
        span = _of(call).attempts.pop(unit.id, None)
        if span is not None:
            span.set_attribute("http.response.status_code", status)
            end_span(span, "ok", error=False)

    def attempt_failed(
        self, call: Call, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        span = _of(call).attempts.pop(unit.id, None)
        if span is not None:
            end_span(span, error.kind, error=True)

    def attempt_cancelled(self, call: Call, unit: UnitState) -> None:
        span = _of(call).attempts.pop(unit.id, None)
        if span is not None:  # the client left, or the hedge's other copy won: no fault
            end_span(span, "cancelled", error=False)

    def hedged(self, call: Call, first: UnitState, second: UnitState, tokens: int) -> None:
        attributes = {"unitgate.unit": first.id, "unitgate.hedge.unit": second.id}
        _of(call).request.add_event("hedge", attributes)

    def hedge_ended(
        self, call: Call, winner: UnitState, loser: UnitState, second: bool, wasted: int
    ) -> None:
        copy = "second" if second else "first"
        attributes = {"unitgate.unit": winner.id, "unitgate.hedge.copy": copy}
        _of(call).request.add_event("hedge won", attributes)

    def resumed(self, call: Call, broken: UnitState, outcome: Resumption, detail: str) -> None:
        _of(call).request.add_event("resume", {"unitgate.unit": broken.id, "outcome": outcome})

    def ended(self, call: Call) -> None:
        trace = _of(call)
        error = call.error
        if error is not None:
            outcome = "cancelled" if isinstance(error, asyncio.CancelledError) else "error"
            for span in trace.attempts.values():  # ended while an attempt was in flight
                name = outcome if outcome == "cancelled" else type(error).__name__
                end_span(span, name, error=True)
            trace.attempts.clear()
            end_span(trace.request, outcome, error=True)
            return
        status = call.status
        assert status is not None  # a request that did not fail was answered
        trace.request.set_attribute("http.response.status_code", status)
        end_span(trace.request, "ok" if status < 400 else "refused", error=status >= 500)


def _of(call: Call) -> _Trace:
    trace = call.trace
    assert isinstance(trace, _Trace)
    return trace
