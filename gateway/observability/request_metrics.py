"""The request path's Prometheus metrics, as a subscriber to its signals (proxy/signals.py)."""

from __future__ import annotations

from gateway.errors import UpstreamError
from gateway.observability.histogram import Histogram
from gateway.observability.metrics import Metrics
from gateway.outcomes import End, Failure
from gateway.proxy.signals import Observer
from gateway.units import UnitState


class MetricsObserver(Observer):
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def refused(self, status: int) -> None:
        self.m.requests.labels("none", str(status)).inc()

    def rejected(self, code: str) -> None:
        self.m.rejections.labels(code).inc()

    def attempt_failed(self, unit: UnitState, error: UpstreamError, started: float) -> None:
        self.m.upstream_failures.labels(unit.id, error.kind).inc()

    def retried(self, kind: Failure) -> None:
        self.m.retries.labels(kind).inc()

    def budget_exhausted(self) -> None:
        self.m.budget_exhausted.inc()

    def first_byte(self, unit: UnitState, ttft: float) -> None:
        self.m.ttft.labels(unit.id).observe(ttft)

    def answer_ended(self, unit: UnitState, end: End, gap: float | None, started: float) -> None:
        if end is End.CLIENT_GONE:
            self.m.cancellations.labels(unit.id).inc()
        elif end is not End.COMPLETE:
            self.m.upstream_failures.labels(unit.id, end).inc()

    def cancelled(self, unit_id: str) -> None:
        self.m.cancellations.labels(unit_id).inc()

    def resumed(self, broken: UnitState, outcome: str, rid: str, detail: str) -> None:
        self.m.resumptions.labels(broken.id, outcome).inc()

    def finished(self, unit_id: str, status: int, duration: float) -> None:
        self.m.requests.labels(unit_id, str(status)).inc()
        self.m.e2e.labels(unit_id).observe(duration)

    def token_gaps(self, unit_id: str) -> Histogram:
        return self.m.itl.labels(unit_id)
