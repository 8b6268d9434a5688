"""A unit as the operator sees it: every bit that decides routability, each with its reason.

"Why is this unit not taking traffic?" should be answerable from one object: health (the
prober's), breaker (the breaker's) and admin (the operator's) are shown side by side rather
than folded into one status, because each has a different owner and a different fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.admin.replicas import FleetUnit
from gateway.admin.state import Mark, drained, public_state
from gateway.units import UnitState

BreakerView = Callable[[str], dict[str, object]]
WorkersView = Callable[[], list[dict[str, Any]]]  # the control plane's worker processes
# Until every worker applied the state as it is now, at most this many seconds (False: one
# had not): an admin change answered is in effect on every worker.
Settle = Callable[[float], Awaitable[bool]]


def unit_view(
    unit: UnitState,
    mark: Mark,
    breaker_view: BreakerView | None,
    fleet: FleetUnit | str | None = None,
) -> dict[str, Any]:
    """`fleet`: the unit across the replicas sharing state (or why that cannot be read, which
    makes nothing `drained`); None for a gateway on its own."""
    quiet = None
    if isinstance(fleet, FleetUnit):
        quiet = fleet.quiet
    elif isinstance(fleet, str):
        quiet = False
    view = {
        "id": unit.id,
        "routable": unit.serving or unit.panicked,
        "panic_routed": unit.panicked,
        "cell": unit.cell,
        "revision": unit.revision,
        # Why routing leaves it out though its bits allow it: another revision than its
        # cell's ("" = not for that reason).
        "idle": unit.why_idle,
        "health": {
            "state": unit.health.value,
            "healthy": unit.healthy,
            "hard": unit.hard,
            "reason": unit.reasons.get("healthy", ""),
        },
        "breaker": breaker(unit, breaker_view),
        "admin": {
            "state": public_state(unit, mark, quiet),
            "reason": mark.reason,
            "who": mark.who,
            "since": mark.since,
        },
        "in_flight": unit.inflight,
        "resume": {
            "token_ids": unit.token_ids,
            "note": _resume_note(unit.token_ids),
        },
        "drained": drained(unit, quiet),
        "leader": unit.leader,
        "kind": unit.config.kind,
        "served_model": unit.config.served_model or None,
        "weight": unit.weight,
        "cap": unit.cap,
        "models": list(unit.models),
        "nodes": [
            {
                "url": node.url,
                "role": node.role,
                "rank": node.rank,
                "healthy": node.healthy,
                "latency_ms": node.latency_ms,
                "error": node.error,
                # The leader's engine as its last report said (None where it says nothing).
                "step": node.step,
                "pending": node.pending,
                "kv_usage": node.kv_usage,
            }
            for node in unit.nodes
        ],
    }
    view["why"] = why(view)
    if isinstance(fleet, FleetUnit):
        view["fleet"] = {
            "in_flight": fleet.in_flight,
            "current": fleet.current,
            "replicas": dict(fleet.replicas),
        }
    elif isinstance(fleet, str):
        view["fleet"] = {"error": fleet}
    return view


def why(view: dict[str, Any]) -> str:
    """Why the unit takes traffic or not, in one line: each bit that keeps it out, with its
    owner's reason (the admin's first: it is the one an operator set on purpose)."""
    if view["routable"]:
        return "panic-routed: too few units routable" if view["panic_routed"] else "routable"
    admin, health, breaker_state = view["admin"], view["health"], view["breaker"]
    out = []
    if admin["state"] != "enabled":
        out.append(_said(f"admin: {admin['state']}", admin["reason"]))
    if not health["healthy"]:
        out.append(_said(f"health: {health['state']}", health["reason"]))
    if breaker_state.get("state") != "admitting":
        out.append(_said(f"breaker: {breaker_state.get('state')}", breaker_state.get("reason")))
    if view.get("idle"):
        out.append(f"revision: {view['idle']}")
    return "; ".join(out) or "out of the routing snapshot"


def _said(what: str, reason: object) -> str:
    return f"{what} ({reason})" if reason else what


def breaker(unit: UnitState, breaker_view: BreakerView | None) -> dict[str, object]:
    """The breaker's own view when one is wired in, else what its bit alone tells."""
    if breaker_view is not None:
        with contextlib.suppress(KeyError):  # a unit its breaker has not heard of yet
            return breaker_view(unit.id)
    if unit.admitting:
        return {"state": "admitting"}
    return {"state": "ejected", "reason": unit.reasons.get("admitting", "")}


def _resume_note(token_ids: bool | None) -> str:
    if token_ids is None:
        return "unknown until a stream has run on this unit"
    if token_ids:
        return "broken streams are resumed on another unit"
    return "the leader returns no token ids: its broken streams end with an error event"
