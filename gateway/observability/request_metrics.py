"""The request path's Prometheus metrics, as a subscriber to its signals (proxy/signals.py)."""

from __future__ import annotations

import asyncio

from gateway.errors import UpstreamError
from gateway.observability.histogram import Histogram
from gateway.observability.metrics import Metrics
from gateway.outcomes import End, Failure, Resumption
from gateway.proxy.call import Call
from gateway.proxy.signals import Observer
from gateway.units import UnitState


class MetricsObserver(Observer):
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def rejected(self, code: str) -> None:
        self.m.rejections.labels(code).inc()

    def attempt_failed(
        self, call: Call, unit: UnitState, error: UpstreamError, started: float
    ) -> None:
        self.m.upstream_failures.labels(unit.id, error.kind).inc()

    def retried(self, kind: Failure) -> None:
        self.m.retries.labels(kind).inc()

    def budget_exhausted(self) -> None:
        self.m.budget_exhausted.inc()

    def first_byte(self, call: Call, unit: UnitState, ttft: float) -> None:
        self.m.ttft.labels(unit.id).observe(ttft)

    def answer_ended(self, call: Call, unit: UnitState, end: End, gap: float | None) -> None:
        if end is End.CLIENT_GONE:
            self.m.cancellations.labels(unit.id).inc()
        elif end is not End.COMPLETE:
            self.m.upstream_failures.labels(unit.id, end).inc()

    def resumed(self, call: Call, broken: UnitState, outcome: Resumption, detail: str) -> None:
        self.m.resumptions.labels(broken.id, outcome).inc()

    def ended(self, call: Call) -> None:
        unit = "none" if call.unit is None else call.unit.id
        if isinstance(call.error, asyncio.CancelledError):  # the client went away
            self.m.cancellations.labels(unit).inc()
        if call.status is None:
            return
        self.m.requests.labels(unit, str(call.status)).inc()
        if call.unit is not None:
            self.m.e2e.labels(unit).observe(asyncio.get_running_loop().time() - call.start)
        if call.usage is not None:
            self.m.tokens.labels(unit, "prompt").inc(call.usage.prompt)
            self.m.tokens.labels(unit, "completion").inc(call.usage.completion)

    def token_gaps(self, unit_id: str) -> Histogram:
        return self.m.itl.labels(unit_id)
