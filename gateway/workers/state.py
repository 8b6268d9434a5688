"""The routing state a worker routes from, as the control plane sends it.

One message holds the whole state (units with their configs, every bit with its reason, each
unit's effective cap), numbered: a worker that applies version v has everything up to v, and
a restarted worker is current after its first message. A worker keeps a mirror
`UnitRegistry` and applies the message through the registry's own setters, so its listeners
(stream ejection on an unhealthy unit, admission wake-ups) fire as they do in one process, and
its snapshot, panic routing included, is built by the same code from the same bits.

The data plane's API keys ride the same messages, but only when they changed (and always in
a worker's first state): a fleet may hold many keys, and most changes are a unit's bits. They
are records with their secrets' hashes; no secret exists anywhere to be sent.

Caps are split, not copied: worker i of n gets `share(cap, n, i)` of a unit's in-flight cap
(and of a configured `[admission].max_inflight`), so the workers together never admit more
than the cap, whatever the load balance of their connections.
"""

from __future__ import annotations

from typing import Any

from gateway.auth.keys import from_record
from gateway.auth.ring import KeyRing
from gateway.config import UnitConfig
from gateway.config.builder import build, table
from gateway.health_states import Health
from gateway.revisions import from_wire, to_wire
from gateway.units import Bit, UnitRegistry, UnitState

BITS: tuple[Bit, ...] = ("admitting", "enabled", "draining")
WHO = "control"


def share(total: int, count: int, index: int) -> int:
    """Worker `index`'s part of `total` among `count`: the parts sum to `total` exactly, and
    the first `total % count` workers take one more."""
    base, extra = divmod(total, count)
    return base + (index < extra)


def encode(registry: UnitRegistry, version: int, keys: KeyRing | None = None) -> dict[str, Any]:
    """The state message; with `keys`, the whole key table too."""
    found = {
        "t": "state",
        "v": version,
        "units": [_unit(u) for u in registry.units.values()],
        "revisions": to_wire(registry.revisions),
    }
    if keys is not None:
        found["keys"] = [key.record() for key in keys.by_id.values()]
    return found


def apply_keys(ring: KeyRing, message: dict[str, Any]) -> None:
    """A worker's key table replaced by the message's, if it carries one."""
    if "keys" in message:
        ring.replace(from_record(record) for record in message["keys"])


def _unit(unit: UnitState) -> dict[str, Any]:
    return {
        "config": table(unit.config),
        "health": unit.health.value,
        "hard": unit.hard,
        "cap": unit.cap,
        "bits": {bit: getattr(unit, bit) for bit in BITS},
        "reasons": dict(unit.reasons),
        "tied": unit.tied,
    }


def apply(registry: UnitRegistry, message: dict[str, Any], count: int, index: int) -> None:
    """Make `registry` (a worker's mirror) what the message says: units added and removed,
    caps set before bits, so a bit that makes a unit routable finds its cap in place; then the
    cells' revisions and a rollout's split."""
    units = {u["config"]["id"]: u for u in message["units"]}
    for unit_id in [u for u in registry.units if u not in units]:
        registry.remove(unit_id)
    for unit_id, wire in units.items():
        state = registry.units.get(unit_id)
        if state is None:
            state = registry.add(build(UnitConfig, wire["config"], "unit"))
        cap = share(int(wire["cap"]), count, index)
        state.cap = state.configured_cap = cap
        state.tied = bool(wire.get("tied", False))
        reasons: dict[str, str] = wire["reasons"]
        health = Health(wire["health"])
        registry.set_health(unit_id, health, reasons.get("healthy", ""), wire["hard"], WHO)
        for bit in BITS:
            registry.set_bit(unit_id, bit, bool(wire["bits"][bit]), reasons.get(bit, ""), WHO)
    registry.set_revisions(from_wire(message["revisions"]))


def apply_load(registry: UnitRegistry, message: dict[str, Any]) -> None:
    """The requests on each unit that are not this worker's (the control plane's answer to
    each of its reports): the picker weighs them with the worker's own."""
    others: dict[str, int] = message["others"]
    for unit in registry.units.values():
        unit.foreign = int(others.get(unit.id, 0))
