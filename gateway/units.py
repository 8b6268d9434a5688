"""Units as the request path sees them: state bits, load, and an immutable routing snapshot.

A unit is routable when independent bits are all true, each with exactly one writer: the
prober owns `healthy`, the circuit breaker owns `admitting`, the admin API owns `enabled`
(and `draining`). Writers change a bit through the registry, which rebuilds the per-model
snapshot that pickers read; readers never see a half-updated set. Load (`inflight`) is not
part of the snapshot: it changes every request and is read live by the picker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import Literal

from gateway.config import Config, UnitConfig
from gateway.routing.affinity import hash_key

Bit = Literal["healthy", "admitting", "enabled", "draining"]


class UnitState:
    __slots__ = (
        "admitting",
        "cap",
        "config",
        "draining",
        "enabled",
        "healthy",
        "id",
        "inflight",
        "key_hash",
        "leader",
        "models",
        "weight",
    )

    def __init__(self, config: UnitConfig, cap: int, models: tuple[str, ...]) -> None:
        self.config = config
        self.id = config.id
        self.leader = config.leader
        self.weight = config.weight
        self.cap = cap
        self.models = models
        self.key_hash = hash_key(config.id)
        self.inflight = 0
        self.healthy = True
        self.admitting = True
        self.enabled = config.enabled
        self.draining = False

    @property
    def routable(self) -> bool:
        return self.healthy and self.admitting and self.enabled and not self.draining


Snapshot = MappingProxyType[str, tuple[UnitState, ...]]


class UnitRegistry:
    """Owns every UnitState and publishes the routable set per model."""

    def __init__(self, config: Config) -> None:
        served = config.gateway.models
        self.units: dict[str, UnitState] = {
            u.id: UnitState(u, config.unit_cap(u), u.models or served) for u in config.units
        }
        self.models = served
        self._listeners: list[Callable[[UnitState, Bit, bool], None]] = []
        self.snapshot: Snapshot = self._build()

    def routable(self, model: str) -> tuple[UnitState, ...]:
        return self.snapshot.get(model, ())

    def any_routable(self) -> bool:
        return any(self.snapshot.values())

    def set_bit(self, unit_id: str, bit: Bit, value: bool) -> bool:
        """Set one bit; returns True when it changed (and the snapshot was swapped)."""
        unit = self.units[unit_id]
        if getattr(unit, bit) == value:
            return False
        setattr(unit, bit, value)
        self.snapshot = self._build()
        for listener in self._listeners:
            listener(unit, bit, value)
        return True

    def on_change(self, listener: Callable[[UnitState, Bit, bool], None]) -> None:
        self._listeners.append(listener)

    def total_inflight(self) -> int:
        return sum(u.inflight for u in self.units.values())

    def _build(self) -> Snapshot:
        by_model: dict[str, list[UnitState]] = {m: [] for m in self.models}
        for unit in _routable(self.units.values()):
            for model in unit.models:
                by_model[model].append(unit)
        return MappingProxyType({m: tuple(us) for m, us in by_model.items()})


def _routable(units: Iterable[UnitState]) -> Iterable[UnitState]:
    return (u for u in units if u.routable)
