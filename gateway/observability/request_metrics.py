"""The request path's Prometheus metrics, as a subscriber to its signals (gateway/signals.py).

What one request costs here: two dict lookups, for its (unit, model) series and for its
(unit, model, status) counter, then the increments and observations themselves; `.labels()`
runs once per new pair or status, not per request. Nothing runs per token but the inter-token
histogram the relay is handed once per answer (`token_gaps`), labelled by unit alone.
"""

from __future__ import annotations

import asyncio

from gateway.base.loop import KeepsLoop
from gateway.errors import UpstreamError
from gateway.observability.counter import CounterChild
from gateway.observability.histogram import Histogram
from gateway.observability.metrics import Metrics
from gateway.outcomes import End, Failure, Resumption
from gateway.proxy.call import Call
from gateway.proxy.hedging import TIED
from gateway.signals import Observer
from gateway.units import UnitState

NONE = "none"  # the unit, or the model, of a request refused before it was known


class _Series:
    """A serving unit's children of the per-request families for one model, looked up once."""

    __slots__ = ("completion", "e2e", "prompt", "ttft")

    def __init__(self, m: Metrics, unit: str, model: str) -> None:
        self.ttft = m.ttft.labels(unit, model)
        self.e2e = m.e2e.labels(unit, model)
        self.prompt = m.tokens.labels(unit, model, "prompt")
        self.completion = m.tokens.labels(unit, model, "completion")


class MetricsObserver(Observer[Call], KeepsLoop):
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics
        self._series: dict[tuple[str, str], _Series] = {}
        self._requests: dict[tuple[str, str, int], CounterChild] = {}
        self._waits: dict[str, Histogram] = {}
        self._routed: dict[str, CounterChild] = {}
        self._loop = None

    def _of(self, unit: str, model: str) -> _Series:
        series = self._series.get((unit, model))
        if series is None:
            series = self._series[(unit, model)] = _Series(self.m, unit, model)
        return series

    def _count(self, unit: str, model: str, status: int) -> None:
        child = self._requests.get((unit, model, status))
        if child is None:
            child = self.m.requests.labels(unit, model, str(status))
            self._requests[(unit, model, status)] = child
        child.inc()

    def rejected(self, call: Call, code: str) -> None:
        self.m.rejections.labels(code).inc()
        self.m.class_rejections.labels(call.lease.ask.klass, code).inc()

    def admitted(self, call: Call, waited: float) -> None:
        klass = call.lease.ask.klass
        wait = self._waits.get(klass)
        if wait is None:
            wait = self._waits[klass] = self.m.queue_wait.labels(klass)
        wait.observe(waited)
        how = call.routed or "load"
        routed = self._routed.get(how)
        if routed is None:
            routed = self._routed[how] = self.m.routed.labels(how)
        routed.inc()

    def attempt_failed(
        self, call: Call, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        self.m.upstream_failures.labels(unit.id, error.kind).inc()

    def retried(self, kind: Failure) -> None:
        self.m.retries.labels(kind).inc()

    def budget_exhausted(self) -> None:
        self.m.budget_exhausted.inc()

    def prefill_counted(self, call: Call, tokens: int) -> None:
        self.m.hedge_tokens.labels(call.lease.ask.klass, "base").inc(tokens)

    def hedged(self, call: Call, first: UnitState, second: UnitState, tokens: int) -> None:
        klass = call.lease.ask.klass
        self.m.hedges.labels(klass, TIED if call.hedge == TIED else "fired").inc()
        self.m.hedge_tokens.labels(klass, "sent").inc(tokens)
        self.m.unit_hedges.labels(first.id, "hedged").inc()

    def hedge_refused(self, call: Call, reason: str) -> None:
        code = reason.partition(":")[0]
        self.m.hedges.labels(call.lease.ask.klass, "refused_" + code).inc()

    def hedge_ended(
        self, call: Call, winner: UnitState, loser: UnitState, second: bool, wasted: int
    ) -> None:
        klass = call.lease.ask.klass
        self.m.hedges.labels(klass, "second" if second else "first").inc()
        self.m.hedge_tokens.labels(klass, "wasted").inc(wasted)
        self.m.unit_hedges.labels(winner.id, "won").inc()
        self.m.unit_hedges.labels(loser.id, "lost").inc()
        if wasted and call.hedge.startswith(TIED):  # a tied twin is charged once it started
            self.m.hedge_tokens.labels(klass, "sent").inc(wasted)

    def first_byte(self, call: Call, unit: UnitState, ttft: float) -> None:
        # A streamed answer's first bytes are its first event, sent once the unit made its
        # first token. A whole answer's first byte is its last, and an error is no token.
        if call.info.stream and call.status == 200:
            self._of(unit.id, call.info.model).ttft.observe(ttft)

    def answer_ended(self, call: Call, unit: UnitState, end: End, gap: float | None) -> None:
        if end is End.CLIENT_GONE:
            self.m.cancellations.labels(unit.id).inc()
        elif end is not End.COMPLETE:
            self.m.upstream_failures.labels(unit.id, end).inc()

    def resumed(self, call: Call, broken: UnitState, outcome: Resumption, detail: str) -> None:
        self.m.resumptions.labels(broken.id, outcome).inc()

    def ended(self, call: Call) -> None:
        unit = NONE if call.unit is None else call.unit.id
        if isinstance(call.error, asyncio.CancelledError):  # the client went away
            self.m.cancellations.labels(unit).inc()
        if call.status is None:
            return
        info = getattr(call, "info", None)  # unset when intake refused the request
        model = NONE if info is None else info.model
        self._count(unit, model, call.status)
        if call.unit is None:
            return
        series = self._of(unit, model)
        series.e2e.observe((self._loop or self._bind_loop()).time() - call.start)
        if call.usage is not None:
            series.prompt.inc(call.usage.prompt)
            series.completion.inc(call.usage.completion)

    def token_gaps(self, unit_id: str) -> Histogram:
        return self.m.itl.labels(unit_id)
