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

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gateway.config import Config, UnitConfig
from gateway.health_states import Health
from gateway.paths import served
from gateway.revisions import Canary, Revisions
from gateway.routing.affinity import hash_key
from gateway.shares import below_share

log = logging.getLogger("unitgate")

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
        "cell",
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
        "revision",
        "scale",
        "serves",
        "slow_share",
        "tied",
        "token_ids",
        "weight",
        "why_idle",
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
        self.cell, self.revision = config.cell, config.revision
        # Its weight's factor while a rollout runs (revisions.py: a cell keeps its share).
        self.scale = 1.0
        # The share of [health].slow_weight it keeps while slow (less on probation).
        self.slow_share = 1.0
        # Why routing leaves it out though its bits allow it: its revision is not the one its
        # cell serves (set by the registry; "" = not for that reason).
        self.why_idle = ""
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
        # Whether its leader answers a tied request's head when it starts it (its health
        # report says so; set by the prober): hedging may send it both copies at once.
        self.tied = False
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
    def serving(self) -> bool:
        """Routable, and of a revision its cell serves now (to some of its requests)."""
        return self.routable and not self.why_idle

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
    on_revisions: list[Callable[[Revisions], None]] = field(default_factory=list)


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
        self.revisions = Revisions()
        for unit in config.units:
            self.units[unit.id] = self._state(unit)
            self._adopt(unit)
        self._revise()
        self.snapshot: Snapshot = self._build(moving=False)
        # What requests that drew the new revision in the cell being moved route over (the
        # same object as `snapshot` outside a rollout).
        self.moving: Snapshot = self.snapshot

    def routable(self, model: str, moving: bool = False) -> tuple[UnitState, ...]:
        """The model's routable units; `moving`: for a request that drew the new revision of
        the cell a rollout is moving (revisions.py)."""
        return (self.moving if moving else self.snapshot).get(model, ())

    @property
    def canary(self) -> Canary | None:
        return self.revisions.canary

    def set_revisions(self, revisions: Revisions) -> None:
        """What each cell serves and the running rollout's split, as its driver decides."""
        if revisions == self.revisions:
            return
        self.revisions = revisions
        self._rebuild()
        for listener in self._listeners.on_revisions:
            listener(revisions)

    def on_revisions(self, listener: Callable[[Revisions], None]) -> None:
        """`listener(revisions)` after the cells' revisions or a rollout's split changed."""
        self._listeners.on_revisions.append(listener)

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
        self._weigh(unit)
        unit.reasons["healthy"] = reason
        self._publish(BitChange(unit, "healthy", health.routable, reason, who))
        return True

    def _publish(self, change: BitChange) -> None:
        self._rebuild()
        for listener in self._listeners.on_bit:
            listener(change)

    def set_slow_share(self, unit_id: str, share: float) -> None:
        """The share of slow_weight the unit keeps while it is slow (its prober's, each
        round); a slow unit's weight follows at once."""
        unit = self.units[unit_id]
        if unit.slow_share == share:
            return
        unit.slow_share = share
        if unit.health is Health.SLOW:
            self._weigh(unit)
            self._rebuild()

    def _weigh(self, unit: UnitState) -> None:
        slow = self._slow_weight * unit.slow_share if unit.health is Health.SLOW else 1.0
        unit.weight = unit.config.weight * slow * unit.scale

    def _rebuild(self) -> None:
        """Swap the snapshots, then report a panic change (listeners see the new snapshot)."""
        before = self.panic
        self._revise()
        moving = None if self.canary is None else self._build(moving=True)
        self.snapshot = self._build(moving=False)
        self.moving = self.snapshot if moving is None else moving
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
        self._adopt(config)
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

    def _adopt(self, unit: UnitConfig) -> None:
        """The first unit of a cell sets the revision the cell serves (units of another one
        wait for a rollout: `unitgate up` may start both revisions' units at once)."""
        serving = self.revisions.of(unit.cell)
        if serving is None:
            self.revisions = self.revisions.with_serving(unit.cell, unit.revision)
        elif serving != unit.revision:
            log.info(
                "unit %s of revision %r waits in cell %s, which serves %r, for a rollout",
                unit.id, unit.revision, unit.cell, serving,
            )  # fmt: skip

    def _wanted(self, unit: UnitState, moving: bool) -> str:
        """The revision `unit`'s cell serves a request that drew `moving` (revisions.py)."""
        serving = self.revisions.of(unit.cell)
        if serving is None:  # only a cell whose units were all removed: none to route
            serving = unit.revision
        canary = self.revisions.canary
        return serving if canary is None else canary.revision(unit.cell, serving, moving)

    def _revise(self) -> None:
        """Each unit's `why_idle` (of a revision no request of its cell gets) and `scale`."""
        canary = self.revisions.canary
        weights: dict[tuple[str, str], float] = {}
        if canary is not None:
            for unit in self.units.values():
                key = (unit.cell, unit.revision)
                weights[key] = weights.get(key, 0.0) + unit.config.weight
        for unit in self.units.values():
            stay, move = self._wanted(unit, False), self._wanted(unit, True)
            unit.why_idle = "" if unit.revision in (stay, move) else _idle(unit, stay, canary)
            scale = 1.0
            if canary is not None and unit.revision == canary.new and canary.reached(unit.cell):
                old = weights.get((unit.cell, canary.old), 0.0)
                new = weights.get((unit.cell, canary.new), 0.0)
                scale = old / new if old > 0 and new > 0 else 1.0
            if unit.scale != scale:
                unit.scale = scale
                self._weigh(unit)

    def _build(self, moving: bool) -> Snapshot:
        """The routable units by model for the requests that drew `moving` (the same for
        every request outside a rollout); panic routing as the other split sees it is kept
        (`panic`, `panicked`) only for those that did not."""
        by_model: dict[str, list[UnitState]] = {m: [] for m in self.models}
        spare: dict[str, list[UnitState]] = {m: [] for m in self.models}
        serving = dict.fromkeys(self.models, 0)
        for unit in self.units.values():
            unit.panicked = False
            if not unit.in_service or unit.revision != self._wanted(unit, moving):
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
        if not moving:
            self.panic = panic
        return MappingProxyType({m: tuple(us) for m, us in by_model.items()})


def _idle(unit: UnitState, wanted: str, canary: Canary | None) -> str:
    mine = f"revision {unit.revision!r}" if unit.revision else "no revision label"
    if canary is not None and unit.revision == canary.new:
        return (
            f"{mine}: the rollout {canary.id} has not moved cell {unit.cell!r} to it yet"
            f" (the cell serves {wanted!r})"
        )
    return (
        f"{mine}, but cell {unit.cell!r} serves {wanted!r}: a rollout moves traffic to it"
        " (docs/rollouts.md)"
    )
