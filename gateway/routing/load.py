"""A unit's load as the picker weighs it: this gateway's own requests, live, plus the others'.

The gateway counts its own outstanding requests exactly and at once, but only its own: behind
an L4 balancer each replica sees a share of the traffic, and the replicas (and anything else
sending to the unit) never see each other's. The leader sees everything, late: its `/health`
reports its queue (`pending`) and its running sequences (`kv_slots_used`), read each probe
round. So the picker adds to the live own count what the leader reported beyond the own count
at that moment ("the others'"), held until the next round. The own count stays live, which is
what keeps one replica's burst from herding between rounds.
"""

from __future__ import annotations


def others(pending: int | None, running: int | None, own: int) -> int:
    """Requests on the unit that are not this gateway's, from the leader's last report
    (0 when the leader reports no load: then the gateway balances on its own counts)."""
    if pending is None:
        return 0
    return max(0, pending + (running or 0) - own)
