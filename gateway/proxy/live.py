"""The upstream connections of streams in flight, per unit, so a unit's ejection reaches them.

When the prober declares a unit unhealthy, its streams would otherwise run on until the idle
timeout (a follower frozen mid-step leaves the leader silent, not disconnected). Breaking
them at once hands them to resumption, which continues them on a healthy unit.
"""

from __future__ import annotations

from gateway.proxy.connection import ConnectionBroken, UpstreamConnection


class UnitEjected(ConnectionBroken):
    """The health checks took the unit out while this stream was running on it."""


class LiveStreams:
    def __init__(self) -> None:
        self._by_unit: dict[str, set[UpstreamConnection]] = {}

    def add(self, unit_id: str, conn: UpstreamConnection) -> None:
        self._by_unit.setdefault(unit_id, set()).add(conn)

    def discard(self, unit_id: str, conn: UpstreamConnection) -> None:
        conns = self._by_unit.get(unit_id)
        if conns is not None:
            conns.discard(conn)
            if not conns:
                del self._by_unit[unit_id]

    def count(self, unit_id: str | None = None) -> int:
        """Streams in flight on `unit_id`, or on every unit."""
        if unit_id is None:
            return sum(len(conns) for conns in self._by_unit.values())
        return len(self._by_unit.get(unit_id, ()))

    def eject(self, unit_id: str, reason: str) -> int:
        """Break every stream on the unit; returns how many."""
        conns = self._by_unit.pop(unit_id, set())
        for conn in conns:
            conn.fail(UnitEjected(f"unit {unit_id} ejected: {reason}"))
            conn.abort()
        return len(conns)
