"""The breaker gate: feeds traffic outcomes to the breakers and enforces what they decide.

The breaker board is pure; this is its I/O side. It owns the `admitting` bit of every unit
(and the unit's in-flight cap while only trial requests may pass), signals each transition
once with its reason (the events log and the metrics subscribe: health/signals.py), and keeps
one timer armed for the earliest end of an ejection instead of polling.
"""

from __future__ import annotations

import asyncio

from gateway.config import Config
from gateway.health.breaker import BreakerBoard, BreakerState, Transition
from gateway.health.signals import HealthObserver
from gateway.units import UnitRegistry, UnitState


class BreakerGate:
    def __init__(self, config: Config, registry: UnitRegistry, signals: HealthObserver) -> None:
        self.board = BreakerBoard(config.breaker)
        self.registry = registry
        self.signals = signals
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        for unit_id in registry.units:
            self.board.add(unit_id)
        registry.on_membership(self._membership)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def record(self, unit: UnitState, ok: bool, started: float) -> None:
        """One classified traffic outcome (client errors and cancellations never get here)."""
        loop = self._loop
        if loop is None:
            return
        transition = self.board.record(unit.id, ok, loop.time(), started)
        if transition is not None:
            self._apply(transition)

    def view(self, unit_id: str) -> dict[str, object]:
        now = self._loop.time() if self._loop is not None else 0.0
        return self.board.view(unit_id, now)

    def _apply(self, t: Transition) -> None:
        if t.suppressed:
            self.signals.breaker(t)
            return
        unit = self.registry.units.get(t.unit)
        if unit is not None:
            cap = self.board.trial_cap(t.unit)
            unit.cap = unit.configured_cap if cap is None else min(cap, unit.configured_cap)
            admitting = t.new is not BreakerState.EJECTED
            self.registry.set_bit(t.unit, "admitting", admitting, t.reason, "breaker")
        self.signals.breaker(t)
        self._arm()

    def _arm(self) -> None:
        """Keep exactly one timer, at the earliest ejection end."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.board.next_deadline()
        if deadline is not None and self._loop is not None:
            self._timer = self._loop.call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        assert self._loop is not None
        for transition in self.board.tick(self._loop.time()):
            self._apply(transition)
        self._arm()

    def _membership(self, unit: UnitState, added: bool) -> None:
        if added:
            self.board.add(unit.id)
        else:
            self.board.remove(unit.id)
            self._arm()
