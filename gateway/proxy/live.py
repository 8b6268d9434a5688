"""The streams in flight per unit, so that a unit's ejection reaches them.

When the prober declares a unit unhealthy its streams would otherwise run on until the idle
timeout (a follower frozen mid-step leaves the leader silent, not disconnected). An ejection
tightens the idle limit of each resumable stream on the unit: a stream already quiet that long
breaks at once and is resumed elsewhere; one still receiving tokens goes on (a probe can fail
on a loaded but working unit), and breaks only if it then stalls.
"""

from __future__ import annotations

from typing import Protocol


class Ejectable(Protocol):
    def on_unit_ejected(self, quiet: float, reason: str) -> None: ...


class LiveStreams:
    def __init__(self) -> None:
        self._by_unit: dict[str, set[Ejectable]] = {}

    def add(self, unit_id: str, stream: Ejectable) -> None:
        self._by_unit.setdefault(unit_id, set()).add(stream)

    def discard(self, unit_id: str, stream: Ejectable) -> None:
        streams = self._by_unit.get(unit_id)
        if streams is not None:
            streams.discard(stream)
            if not streams:
                del self._by_unit[unit_id]

    def count(self, unit_id: str | None = None) -> int:
        """Streams in flight on `unit_id`, or on every unit."""
        if unit_id is None:
            return sum(len(streams) for streams in self._by_unit.values())
        return len(self._by_unit.get(unit_id, ()))

    def eject(self, unit_id: str, reason: str, quiet: float) -> int:
        """Tighten every stream on the unit to `quiet` seconds of silence; returns how many."""
        streams = list(self._by_unit.get(unit_id, ()))
        for stream in streams:
            stream.on_unit_ejected(quiet, reason)
        return len(streams)
