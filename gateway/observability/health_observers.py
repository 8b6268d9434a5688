"""Health's observers: the metrics and the events log, subscribed to health's signals
(gateway/health/signals.py), so health itself imports neither."""

from __future__ import annotations

from logging import WARNING
from typing import Any

from gateway.health.breaker import Transition
from gateway.health.signals import HealthObserver, HealthSignals
from gateway.health_states import Health
from gateway.observability.events import EventLog
from gateway.observability.metrics import Metrics


class HealthMetrics(HealthObserver):
    """`unitgate_probe_failures`, `unitgate_health_transitions`, `unitgate_breaker_transitions`.
    A label lookup takes a lock: each unit's children are looked up once, then kept."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._failures: dict[tuple[str, int], Any] = {}
        self._flips: dict[tuple[str, Health], Any] = {}

    def probe_failed(self, unit_id: str, rank: int) -> None:
        child = self._failures.get((unit_id, rank))
        if child is None:
            child = self.metrics.probe_failures.labels(unit_id, str(rank))
            self._failures[unit_id, rank] = child
        child.inc()

    def flipped(self, unit_id: str, health: Health, reason: str) -> None:
        child = self._flips.get((unit_id, health))
        if child is None:
            child = self.metrics.health_transitions.labels(unit_id, health.value)
            self._flips[unit_id, health] = child
        child.inc()

    def breaker(self, transition: Transition) -> None:
        to = "suppressed" if transition.suppressed else str(transition.new)
        self.metrics.breaker_transitions.labels(transition.unit, to).inc()


class HealthEvents(HealthObserver):
    """The events log's line for each change: its only log line."""

    def __init__(self, events: EventLog) -> None:
        self.events = events

    def flipped(self, unit_id: str, health: Health, reason: str) -> None:
        self.events.record(unit_id, health.value, reason, "prober")

    def breaker(self, transition: Transition) -> None:
        t = transition
        what = "ejection suppressed" if t.suppressed else f"breaker {t.new}"
        self.events.record(t.unit, what, t.reason, "breaker", WARNING)


def health_signals(events: EventLog, metrics: Metrics) -> HealthSignals:
    """Health's signals with the gateway's two observers subscribed."""
    return HealthSignals([HealthMetrics(metrics), HealthEvents(events)])
