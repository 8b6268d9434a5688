"""Units as the request path sees them: state bits, load, and an immutable routing snapshot.

A unit is routable when independent bits are all true, each with exactly one writer: the
prober owns `healthy`, the circuit breaker owns `admitting` (and `cap` while it lets only trial
requests through), the admin API owns `enabled` and `draining`. Writers change a bit through
the registry, which rebuilds the per-model snapshot that pickers read; readers never see a
half-updated set. Load (`inflight`) is not part of the snapshot: it changes every request and
is read live by the picker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gateway.config import Config, UnitConfig
from gateway.routing.affinity import hash_key

Bit = Literal["healthy", "admitting", "enabled", "draining"]


@dataclass(slots=True)
class NodeStatus:
    """The prober's latest view of one node (written by the prober only)."""

    url: str
    rank: int
    role: str
    healthy: bool | None = None  # None until the first probe
    latency_ms: float | None = None
    error: str | None = None
    step: int | None = None
    pending: int | None = None
    pid: int | None = None


@dataclass(slots=True)
class BitChange:
    unit: UnitState
    bit: Bit
    value: bool
    reason: str
    who: str


class UnitState:
    __slots__ = (
        "admitting",
        "cap",
        "config",
        "configured_cap",
        "draining",
        "enabled",
        "healthy",
        "id",
        "inflight",
        "key_hash",
        "leader",
        "models",
        "nodes",
        "reasons",
        "token_ids",
        "weight",
    )

    def __init__(
        self, config: UnitConfig, cap: int, models: tuple[str, ...], healthy: bool = True
    ) -> None:
        self.config = config
        self.id = config.id
        self.leader = config.leader
        self.weight = config.weight
        self.configured_cap = cap
        self.cap = cap  # lowered by the breaker while it admits trial requests only
        self.models = models
        self.key_hash = hash_key(config.id)
        self.inflight = 0
        self.healthy = healthy
        self.admitting = True
        self.enabled = config.enabled
        self.draining = False
        # Why each bit has its current value (for the admin view and the events log).
        self.reasons: dict[Bit, str] = {}
        # Whether the unit's leader returns token ids (learned from its streams; None until
        # one has run): without them its broken streams cannot be resumed elsewhere.
        self.token_ids: bool | None = None
        self.nodes = [
            NodeStatus(url, rank, "leader" if rank == 0 else "follower")
            for rank, url in enumerate(config.nodes)
        ]

    @property
    def routable(self) -> bool:
        return self.healthy and self.admitting and self.enabled and not self.draining


Snapshot = MappingProxyType[str, tuple[UnitState, ...]]
Listener = Callable[[BitChange], None]


@dataclass
class _Listeners:
    on_bit: list[Listener] = field(default_factory=list)
    on_membership: list[Callable[[UnitState, bool], None]] = field(default_factory=list)


class UnitRegistry:
    """Owns every UnitState and publishes the routable set per model."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self.models = config.gateway.models
        self.units: dict[str, UnitState] = {}
        self._listeners = _Listeners()
        for unit in config.units:
            self.units[unit.id] = self._state(unit, healthy=True)
        self.snapshot: Snapshot = self._build()

    def routable(self, model: str) -> tuple[UnitState, ...]:
        return self.snapshot.get(model, ())

    def any_routable(self) -> bool:
        return any(self.snapshot.values())

    def set_bit(
        self, unit_id: str, bit: Bit, value: bool, reason: str = "", who: str = "system"
    ) -> bool:
        """Set one bit; returns True when it changed (and the snapshot was swapped)."""
        unit = self.units[unit_id]
        if getattr(unit, bit) == value:
            return False
        setattr(unit, bit, value)
        unit.reasons[bit] = reason
        self.snapshot = self._build()
        change = BitChange(unit, bit, value, reason, who)
        for listener in self._listeners.on_bit:
            listener(change)
        return True

    def add(self, config: UnitConfig) -> UnitState:
        """A unit added at run time: unhealthy until its prober has seen it pass."""
        if config.id in self.units:
            raise KeyError(config.id)
        unit = self.units[config.id] = self._state(config, healthy=False)
        unit.reasons["healthy"] = "added: waiting for probes"
        self.snapshot = self._build()
        for listener in self._listeners.on_membership:
            listener(unit, True)
        return unit

    def remove(self, unit_id: str) -> UnitState:
        unit = self.units.pop(unit_id)
        self.snapshot = self._build()
        for listener in self._listeners.on_membership:
            listener(unit, False)
        return unit

    def on_change(self, listener: Listener) -> None:
        self._listeners.on_bit.append(listener)

    def on_membership(self, listener: Callable[[UnitState, bool], None]) -> None:
        """`listener(unit, added)` after a unit is added (True) or removed (False)."""
        self._listeners.on_membership.append(listener)

    def total_inflight(self) -> int:
        return sum(u.inflight for u in self.units.values())

    def _state(self, unit: UnitConfig, healthy: bool) -> UnitState:
        cap = self._config.unit_cap(unit)
        return UnitState(unit, cap, unit.models or self.models, healthy)

    def _build(self) -> Snapshot:
        by_model: dict[str, list[UnitState]] = {m: [] for m in self.models}
        for unit in self.units.values():
            if unit.routable:
                for model in unit.models:
                    by_model[model].append(unit)
        return MappingProxyType({m: tuple(us) for m, us in by_model.items()})
