"""Units as the request path sees them: state bits, load, and an immutable routing snapshot.

A unit is routable when independent bits all allow it, each with exactly one writer: the
prober owns `health` (unknown, healthy, slow, unhealthy; a slow unit is routed at a lower
weight), the circuit breaker owns `admitting` (and `cap` while it lets only trial requests
through), the admin API owns `enabled` and `draining`. Writers change a bit through the
registry, which rebuilds the per-model snapshot that pickers read; readers never see a
half-updated set. Load (`inflight`) is not part of the snapshot: it changes every request and
is read live by the picker.

Panic routing (Envoy's panic threshold) caps what health may take out, every cause counted
together: when fewer than `[health].panic_threshold` of a model's units in service are
routable, the snapshot also holds the units that are out for soft reasons (probe timeouts
with nothing to vouch for them) or by their breaker. A unit out on hard evidence (refused,
wrong identity, stalled) stays out: routing to a dead unit helps no one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gateway.config import Config, UnitConfig
from gateway.health_states import Health
from gateway.paths import served
from gateway.routing.affinity import hash_key
from gateway.shares import below_share

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
    kv_usage: float | None = None  # the leader's KV-cache share in use, where its kind says


@dataclass(slots=True)
class BitChange:
    """`value` is the bit's new value; for `healthy`, whether the unit's health now routes
    (the state itself is `unit.health`)."""

    unit: UnitState
    bit: Bit
    value: bool
    reason: str
    who: str


@dataclass(frozen=True, slots=True)
class PanicChange:
    model: str
    active: bool
    reason: str


class UnitState:
    __slots__ = (
        "admitting",
        "cap",
        "config",
        "configured_cap",
        "draining",
        "enabled",
        "extra_head",
        "foreign",
        "hard",
        "health",
        "id",
        "inflight",
        "key_hash",
        "leader",
        "models",
        "nodes",
        "panicked",
        "reasons",
        "serves",
        "token_ids",
        "weight",
    )

    def __init__(
        self,
        config: UnitConfig,
        cap: int,
        models: tuple[str, ...],
        health: Health = Health.HEALTHY,
    ) -> None:
        self.config = config
        self.id = config.id
        self.leader = config.leader
        self.serves = served(config.kind, config.backend)  # the API paths it answers
        # The unit's own header lines on every request (its API key, its `headers`).
        self.extra_head = config.header_lines()
        self.weight = config.weight  # lowered by the registry while the unit is slow
        self.configured_cap = cap
        self.cap = cap  # lowered by the breaker while it admits trial requests only
        self.models = models
        self.key_hash = hash_key(config.id)
        self.inflight = 0
        # Requests on the unit that are not this gateway's (other replicas'), as its leader
        # last reported them (gateway/routing/load.py); read by the picker with `inflight`.
        self.foreign = 0
        self.health = health
        self.hard = False  # unhealthy on hard evidence: panic routing never brings it back
        self.panicked = False  # in the snapshot only because of panic routing
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
    def healthy(self) -> bool:
        return self.health.routable

    @property
    def in_service(self) -> bool:
        """What the operator allows: the share panic routing counts is of these units."""
        return self.enabled and not self.draining

    @property
    def routable(self) -> bool:
        return self.health.routable and self.admitting and self.in_service

    @property
    def rescuable(self) -> bool:
        """Out, but only on soft evidence or by its breaker: panic routing may use it."""
        if not self.in_service or self.routable or self.health is Health.UNKNOWN:
            return False
        return not (self.health is Health.UNHEALTHY and self.hard)


Snapshot = MappingProxyType[str, tuple[UnitState, ...]]
Listener = Callable[[BitChange], None]


@dataclass
class _Listeners:
    on_bit: list[Listener] = field(default_factory=list)
    on_membership: list[Callable[[UnitState, bool], None]] = field(default_factory=list)
    on_panic: list[Callable[[PanicChange], None]] = field(default_factory=list)


class UnitRegistry:
    """Owns every UnitState and publishes the routable set per model."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self.models = config.gateway.models
        self.units: dict[str, UnitState] = {}
        self._listeners = _Listeners()
        h = config.health
        # Without probers nothing would ever judge a unit: it is taken as healthy.
        self._initial = Health.UNKNOWN if h.enabled else Health.HEALTHY
        self._slow_weight = h.slow_weight
        self._panic_threshold = h.panic_threshold
        self.panic: dict[str, str] = {}  # model -> why, while its units are panic-routed
        for unit in config.units:
            self.units[unit.id] = self._state(unit)
        self.snapshot: Snapshot = self._build()

    def routable(self, model: str) -> tuple[UnitState, ...]:
        return self.snapshot.get(model, ())

    def any_routable(self) -> bool:
        return any(self.snapshot.values())

    def set_bit(
        self, unit_id: str, bit: Bit, value: bool, reason: str = "", who: str = "system"
    ) -> bool:
        """Set one bit; returns True when it changed (and the snapshot was swapped)."""
        if bit == "healthy":
            raise ValueError("the prober's health is set with set_health")
        unit = self.units[unit_id]
        if getattr(unit, bit) == value:
            return False
        setattr(unit, bit, value)
        unit.reasons[bit] = reason
        self._publish(BitChange(unit, bit, value, reason, who))
        return True

    def set_health(
        self, unit_id: str, health: Health, reason: str, hard: bool = False, who: str = "prober"
    ) -> bool:
        """The prober's verdict; returns True when the state or the kind of evidence changed."""
        unit = self.units[unit_id]
        hard = hard and health is Health.UNHEALTHY
        if unit.health is health and unit.hard == hard:
            return False
        unit.health, unit.hard = health, hard
        unit.weight = unit.config.weight * (self._slow_weight if health is Health.SLOW else 1.0)
        unit.reasons["healthy"] = reason
        self._publish(BitChange(unit, "healthy", health.routable, reason, who))
        return True

    def _publish(self, change: BitChange) -> None:
        self._rebuild()
        for listener in self._listeners.on_bit:
            listener(change)

    def _rebuild(self) -> None:
        """Swap the snapshot, then report a panic change (listeners see the new snapshot)."""
        before = self.panic
        self.snapshot = self._build()
        changes = [PanicChange(m, True, why) for m, why in self.panic.items() if m not in before]
        changes += [
            PanicChange(m, False, "enough units routable again")
            for m in before
            if m not in self.panic
        ]
        for change in changes:
            for listener in self._listeners.on_panic:
                listener(change)

    def add(self, config: UnitConfig) -> UnitState:
        """A unit added at run time: unknown (not routable) until a probe round has judged it."""
        if config.id in self.units:
            raise KeyError(config.id)
        unit = self.units[config.id] = self._state(config)
        self._rebuild()
        for listener in self._listeners.on_membership:
            listener(unit, True)
        return unit

    def remove(self, unit_id: str) -> UnitState:
        unit = self.units.pop(unit_id)
        self._rebuild()
        for listener in self._listeners.on_membership:
            listener(unit, False)
        return unit

    def on_change(self, listener: Listener) -> None:
        self._listeners.on_bit.append(listener)

    def on_membership(self, listener: Callable[[UnitState, bool], None]) -> None:
        """`listener(unit, added)` after a unit is added (True) or removed (False)."""
        self._listeners.on_membership.append(listener)

    def on_panic(self, listener: Callable[[PanicChange], None]) -> None:
        """`listener(change)` when a model's units enter or leave panic routing."""
        self._listeners.on_panic.append(listener)

    def total_inflight(self) -> int:
        return sum(u.inflight for u in self.units.values())

    def capacity(self) -> int:
        """Slots the units in service offer (at least 1: with none, a request is refused by
        the picker, 503, rather than queued for a capacity of nothing). Unhealthy units count:
        a count too large only lets the picker's own caps bind, one too small would hold
        requests back from free slots (and panic routing uses units that are not routable)."""
        return max(1, sum(u.configured_cap for u in self.units.values() if u.in_service))

    def _state(self, unit: UnitConfig) -> UnitState:
        cap = self._config.unit_cap(unit)
        state = UnitState(unit, cap, unit.models or self.models, self._initial)
        if self._initial is Health.UNKNOWN:
            state.reasons["healthy"] = "waiting for its first probe round"
        return state

    def _build(self) -> Snapshot:
        by_model: dict[str, list[UnitState]] = {m: [] for m in self.models}
        spare: dict[str, list[UnitState]] = {m: [] for m in self.models}
        serving = dict.fromkeys(self.models, 0)
        for unit in self.units.values():
            unit.panicked = False
            if not unit.in_service:
                continue
            for model in unit.models:
                serving[model] += 1
                if unit.routable:
                    by_model[model].append(unit)
                elif unit.rescuable:
                    spare[model].append(unit)
        panic: dict[str, str] = {}
        for model, units in by_model.items():
            if spare[model] and below_share(len(units), self._panic_threshold, serving[model]):
                panic[model] = (
                    f"{len(units)} of {serving[model]} units in service routable, below the "
                    f"panic threshold ({self._panic_threshold:g}): routing across "
                    f"{len(spare[model])} more out for soft reasons or by their breaker"
                )
                units.extend(spare[model])
                for unit in spare[model]:
                    unit.panicked = True
        self.panic = panic
        return MappingProxyType({m: tuple(us) for m, us in by_model.items()})
