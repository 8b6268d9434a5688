"""Health's transitions, as signals its observers subscribe to.

The probers and the breaker gate say what happened (a node failed its probe, a unit's health
flipped, a breaker moved or an ejection was suppressed) and nothing else: the metrics and the
events log subscribe (gateway/observability/health_observers.py), as they do to the request
path's signals (gateway/signals.py), so health imports no observability module. Hooks run
synchronously on the event loop, once per event.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.health.breaker import Transition
from gateway.health_states import Health


class HealthObserver:
    """One subscriber: override the hooks it needs; the others do nothing."""

    def probe_failed(self, unit_id: str, rank: int) -> None:
        """A node of the unit failed this round's probe (its problem is on the node's view)."""

    def flipped(self, unit_id: str, health: Health, reason: str) -> None:
        """The prober's verdict on the unit changed, for `reason`."""

    def breaker(self, transition: Transition) -> None:
        """The unit's breaker moved, or its ejection was suppressed (`transition.suppressed`)."""


class HealthSignals(HealthObserver):
    """The fan-out the probers and the gate hold: every hook, to every observer in order."""

    def __init__(self, observers: Iterable[HealthObserver] = ()) -> None:
        self.observers = list(observers)

    def subscribe(self, observer: HealthObserver) -> None:
        self.observers.append(observer)

    def probe_failed(self, unit_id: str, rank: int) -> None:
        for o in self.observers:
            o.probe_failed(unit_id, rank)

    def flipped(self, unit_id: str, health: Health, reason: str) -> None:
        for o in self.observers:
            o.flipped(unit_id, health, reason)

    def breaker(self, transition: Transition) -> None:
        for o in self.observers:
            o.breaker(transition)
