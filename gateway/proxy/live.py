"""The streams in flight per unit: what an ejection reaches, and what vouches for a slow unit.

When the prober declares a unit unhealthy its streams would otherwise run on until the idle
timeout (a follower frozen mid-step leaves the leader silent, not disconnected). An ejection
tightens the idle limit of each resumable stream on the unit: a stream already quiet by its
own pace breaks at once and is resumed elsewhere; one still receiving tokens goes on (a probe
can fail on a loaded but working unit), and breaks only if it then goes quiet.

The other way round, a unit whose probes time out while its streams keep flowing is busy,
not dead: `flowing` answers that for the prober, from state the relay keeps anyway (the last
read and the stream's own gap) and from when the unit's last answer began or completed. For
a follower whose probe timed out while its leader answered, only progress made since the
probe went out counts (`progressed`): traffic heard before a node froze says nothing of it.
"""

from __future__ import annotations

from typing import Protocol

from gateway.base.loop import KeepsLoop
from gateway.outcomes import End
from gateway.proxy.call import Call
from gateway.relay.pace import is_quiet, quiet_after
from gateway.signals import Observer
from gateway.units import UnitState


class Live(Protocol):
    def on_unit_ejected(self, reason: str) -> bool:
        """True when the stream will break (for resumption) once quiet by its own pace."""
        ...

    def pace(self) -> tuple[float, float | None] | None:
        """(loop time of the last data, the running gap estimate), or None between answers."""
        ...


class LiveStreams(Observer[Call], KeepsLoop):
    """Subscribed to the request path's signals for two of them: an answer that opened in
    time, or one that came to its end, is the newest proof that its unit serves (`flowing`)."""

    def __init__(self, floor: float, factor: float) -> None:
        self.floor, self.factor = floor, factor
        self._by_unit: dict[str, set[Live]] = {}
        # unit -> when its last answer's first byte came, or an answer of it completed
        self._heard: dict[str, float] = {}
        self._done: dict[str, float] = {}  # unit -> when an answer of it last completed
        self._loop = None

    def add(self, unit_id: str, stream: Live) -> None:
        self._by_unit.setdefault(unit_id, set()).add(stream)

    def discard(self, unit_id: str, stream: Live) -> None:
        streams = self._by_unit.get(unit_id)
        if streams is not None:
            streams.discard(stream)
            if not streams:
                del self._by_unit[unit_id]

    def attempt_opened(self, call: Call, unit: UnitState, status: int) -> None:
        self._heard[unit.id] = (self._loop or self._bind_loop()).time()  # (began, inlined)

    def answer_ended(self, call: Call, unit: UnitState, end: End, gap: float | None) -> None:
        if end is End.COMPLETE:  # (completed, inlined: both run on every request)
            now = (self._loop or self._bind_loop()).time()
            self._heard[unit.id] = self._done[unit.id] = now

    def began(self, unit_id: str, now: float) -> None:
        """An answer from the unit started (its first byte arrived within its timeout)."""
        self._heard[unit_id] = now

    def completed(self, unit_id: str, now: float) -> None:
        """An answer from the unit came to its end: a unit whose answers all just ended (a
        wave of streams ended, the next not yet begun) still served a moment ago."""
        self._heard[unit_id] = now
        self._done[unit_id] = now

    def forget(self, unit_id: str) -> None:
        """The unit was removed."""
        self._heard.pop(unit_id, None)
        self._done.pop(unit_id, None)

    def count(self, unit_id: str | None = None) -> int:
        """Streams in flight on `unit_id`, or on every unit."""
        if unit_id is None:
            return sum(len(streams) for streams in self._by_unit.values())
        return len(self._by_unit.get(unit_id, ()))

    def flowing(self, unit_id: str, now: float, since: float | None = None) -> bool:
        """Whether the unit's live traffic is arriving at its own pace right now; with
        `since`, whether the unit made progress after that loop time (`progressed`)."""
        if since is not None:
            ago = self.progressed(unit_id, now, now - since)
            return ago is not None and now - ago >= since
        heard = self._heard.get(unit_id)
        if heard is not None and now - heard <= self.floor:
            return True
        for stream in self._by_unit.get(unit_id, ()):
            pace = stream.pace()
            if pace is not None and not is_quiet(now, *pace, self.floor, self.factor):
                return True
        return False

    def progressed(self, unit_id: str, now: float, enough: float = 0.0) -> float | None:
        """Seconds since the unit last made progress a client can see: data read from one of
        its streams, or an answer of it completed (every token needs every node of the
        unit). A first byte is not progress: a leader sends its answer's head before its gang
        has stepped. The walk stops at a stream with data within `enough` seconds. None: no
        progress seen."""
        last = self._done.get(unit_id)
        for stream in self._by_unit.get(unit_id, ()):
            pace = stream.pace()
            if pace is not None and (last is None or pace[0] > last):
                last = pace[0]
                if now - last <= enough:
                    break
        return None if last is None else now - last

    def flowing_for(self, unit_id: str, now: float) -> float:
        """Seconds from `now` during which `flowing` stays true if no more data came: the
        pace rule's own horizon, which a worker reports to its control plane (0: not
        flowing now)."""
        horizon = 0.0
        heard = self._heard.get(unit_id)
        if heard is not None:
            horizon = heard + self.floor - now
        for stream in self._by_unit.get(unit_id, ()):
            pace = stream.pace()
            if pace is not None:
                last, gap = pace
                horizon = max(horizon, last + quiet_after(gap, self.floor, self.factor) - now)
        return max(horizon, 0.0)

    def eject(self, unit_id: str, reason: str) -> int:
        """Tell every stream on the unit; returns how many will break for resumption."""
        streams = list(self._by_unit.get(unit_id, ()))
        return sum(stream.on_unit_ejected(reason) for stream in streams)
