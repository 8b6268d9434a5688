"""The admin's view of a unit: which service state the operator chose, why, by whom, since when.

The registry keeps the bits the request path reads (`enabled`, `draining`); this keeps the
operator-facing story behind them, which is what the view shows and what survives restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.auth.keys import Key
from gateway.units import UnitState

State = Literal["enabled", "disabled", "draining"]
STATES: tuple[State, ...] = ("enabled", "disabled", "draining")

# The registry bits (enabled, draining) that each admin state stands for.
BITS: dict[State, tuple[bool, bool]] = {
    "enabled": (True, False),
    "disabled": (False, False),
    "draining": (True, True),
}


@dataclass(frozen=True, slots=True)
class Mark:
    state: State
    reason: str
    who: str
    since: float  # Unix time


@dataclass(frozen=True, slots=True)
class AddedUnit:
    config: dict[str, Any]  # the UnitConfig as JSON, rebuilt (and re-validated) on restore
    who: str
    since: float


@dataclass(frozen=True, slots=True)
class Removal:
    who: str
    since: float


@dataclass(slots=True)
class Saved:
    """Everything the store holds: the operator's overrides of the config file."""

    marks: dict[str, Mark] = field(default_factory=dict)
    added: dict[str, AddedUnit] = field(default_factory=dict)
    removed: dict[str, Removal] = field(default_factory=dict)  # units of the config file
    keys: dict[str, Key] = field(default_factory=dict)  # data-plane API keys, by id
    # Rollouts' records by id, oldest first (gateway/rollout/record.py), and the revision
    # each cell serves where a rollout changed it.
    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)
    serving: dict[str, str] = field(default_factory=dict)


def saved_mark(unit: str, state: str, reason: str, who: str, since: float) -> Mark:
    """A mark read back from a store, its state checked: a newer gateway may have written
    one this gateway does not know."""
    if state not in STATES:
        raise ValueError(f"unit {unit!r} has unknown admin state {state!r}")
    return Mark(state, reason, who, float(since))


def public_state(unit: UnitState, mark: Mark, quiet: bool | None = None) -> str:
    """ "drained" is "draining" with nothing left in flight: the unit may now be taken down.
    `quiet`: whether nothing is in flight on it (None: this gateway's count says)."""
    if mark.state == "draining" and (unit.inflight <= 0 if quiet is None else quiet):
        return "drained"
    return mark.state


def drained(unit: UnitState, quiet: bool | None = None) -> bool:
    """Out of service by the operator's choice and no request still running on it (`quiet`
    as in `public_state`: a fleet's replicas together, where they share their state)."""
    idle = unit.inflight <= 0 if quiet is None else quiet
    return (not unit.enabled or unit.draining) and idle
